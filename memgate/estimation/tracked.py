"""Categories in an estimate: the storages of the models and optimizers an estimate was told to track
(``est.track(model, opt)``, as ``Recorder.track``), noted at the same moments as a recording notes them.

A meta storage has no address: each is noted by its number in the estimate (plus one: an address is never
0), and the replay puts the block's address in its place (:meth:`memgate.estimation.api.Estimator.snapshot`),
so the snapshot loader attributes the blocks by address and lifetime as for a recording
(:mod:`memgate.categories`). Each moment is a mark in the estimate's order of events, written as the
snapshot's ``memgate::note#k`` annotation.
"""

from __future__ import annotations

from typing import Any

from memgate.categories import NOTE_PREFIX
from memgate.loaders.snapshot.snapshot_estimate import DEVICE
from memgate.tracking import StorageTracker


class EstimateTracker(StorageTracker):
    """:class:`memgate.tracking.StorageTracker` over meta storages (module docstring)."""

    def __init__(self, torch: Any, storages: Any) -> None:
        super().__init__(torch)
        self._estimate = storages

    def note(self, why: str) -> None:
        if self.active and self.tracking:
            self._estimate.mark(f"{NOTE_PREFIX}{len(self.moments)}")
        super().note(why)

    def locate(self, tensor: Any) -> tuple[str, int, int] | None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError, AttributeError):
            return None
        if storage.device.type != "meta":
            return None
        known = self._estimate.live.get(int(storage._cdata))
        if known is None or known[0].expired():
            return None
        return DEVICE, known[1] + 1, int(storage.nbytes())


def placed(record: dict[str, Any] | None, address_of: dict[int, int]) -> dict[str, Any] | None:
    """The tracker's record with each storage's number replaced by its block's address (rows whose storage
    got no block dropped)."""
    if record is None:
        return None
    rows = []
    for row in record["storages"]:
        address = address_of.get(int(row[2]) - 1)
        if address is not None:
            rows.append([row[0], row[1], address, *row[3:]])
    moments = [{k: v for k, v in m.items() if k != "t_ns"} for m in record["moments"]]
    return {**record, "moments": moments, "storages": rows}
