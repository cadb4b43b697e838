"""What a profile leaves allocated when its window ends: for a test ``memgate_record`` recorded, what
the test left behind. Pure.

Per device, the blocks allocated inside the window (a known ``t_alloc``) that are still allocated when
it ends (no ``t_free``), of the device's framework allocator (its block components, as leaks count
them). The recorder runs ``gc.collect()`` before it stops, right after the test body, so what a test's
own locals held is freed by then: what is left is held by something that outlives the test (a
module-level list, a cache, a global model, a fixture of a wider scope). Memory allocated before the
window (a model built by an earlier test) is not the test's and is never counted.

The holders are listed like the holders at a peak (:func:`memgate.metrics.top_at`): op, owner,
category (a tracked recording's), and, for a recording, the Python functions that allocated them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memgate.lazy import lazy_module
from memgate.metric_specs import HISTORY_OF, LEFT_ALLOCATED
from memgate.metrics import block_components, framework_component, top_at
from memgate.model import DeviceModel, Profile

if TYPE_CHECKING:
    import numpy as np
else:  # imported on first use: pytest loads the plugin, and so this module, on every run
    np = lazy_module("numpy", globals(), "np")

HOLDERS = 50  # blocks kept per device, as top_at_peak keeps them


@dataclass(frozen=True)
class LeftOn:
    """One device's blocks left allocated at the end of the window."""

    device: str
    bytes: int | None  # None: not measurable (``why``)
    count: int = 0  # how many blocks
    holders: list[dict[str, Any]] = field(default_factory=list)  # the largest of them
    why: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"device": self.device, "bytes": self.bytes, "count": self.count, "holders": self.holders,
                **({"why": self.why} if self.why else {})}

    def summary(self, test: str) -> dict[str, Any]:
        """What ``--memgate-report-left`` lists of it: the test, the device, the bytes and blocks, and the
        largest holder in words (op, owner, category)."""
        top = self.holders[0] if self.holders else {}
        words = [str(top[k]) for k in ("op", "owner", "category") if top.get(k)]
        return {"test": test, "device": self.device, "bytes": self.bytes, "count": self.count,
                "largest": {"size": top.get("size"), "what": ", ".join(words)} if top else None}


def left_on(profile: Profile, device: DeviceModel) -> LeftOn:
    """The blocks of ``device`` allocated in the window and still allocated at its end."""
    blocks = device.blocks
    # The loader's word on the history (none, a filled ring buffer, frees without addresses) comes first: the
    # blocks of an incomplete history read as fewer left than were (the dump's blocks have no allocation time).
    history = profile.not_measurable(device.device).get(HISTORY_OF[LEFT_ALLOCATED])
    if history:
        return LeftOn(device.device, None, why=history)
    if not len(blocks):
        return LeftOn(device.device, None, why="no per-block data (allocation events) to find what is left")
    components = block_components(device, framework_component(device))
    component = blocks.texts("component")
    mine = component.isin(components) if components is not None else np.ones(len(blocks), dtype=bool)
    rows = np.flatnonzero(mine & blocks.ints("t_alloc").present() & blocks.ints("t_free").isna())
    size = int(blocks.ints("size").values[rows].sum())
    return LeftOn(device.device, size, len(rows), top_at(blocks, rows, HOLDERS) if len(rows) else [])


def left_behind(profile: Profile) -> list[LeftOn]:
    """:func:`left_on` of every device of ``profile``, in its order."""
    return [left_on(profile, device) for device in profile.devices]
