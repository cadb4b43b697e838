"""A snapshot that :mod:`memgate.estimation` wrote on a CPU-only machine: an estimate of a CUDA run, said so.

Its ``memgate_estimate`` record names the device it was estimated for, the torch release and allocator
settings, where the workspace sizes come from, what the model cannot see and the operators it could not
model. The profile's platform is ``estimated: <device>`` (history keeps estimates apart from measurements),
every note says the figures are an estimate, and an operator the model could not follow makes the history
figures not measurable, with why, never a silent guess.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memgate import categories
from memgate.errors import InputError
from memgate.metric_specs import Fact, not_measurable
from memgate.model import DeviceModel
from memgate.schemas import load_schema
from memgate.table import Table

KEY = "memgate_estimate"
ESTIMATED = "estimated: "  # the platform's device name: "estimated: NVIDIA H200"
_TEXTS = ("device", "torch", "allocator", "compute")
DEVICE = "cuda:0"  # the device an estimate's blocks are on


def metadata(path: Path, raw: Any) -> dict[str, Any]:
    """What the estimate record adds to the profile's metadata; {} for a snapshot torch wrote."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(raw.get(k), str) for k in _TEXTS):
        raise InputError("malformed estimate record", file=path, column=KEY,
                         expected=f"an object with the texts {', '.join(_TEXTS)} (memgate.estimate writes it)",
                         found=raw)
    unmodelled = raw.get("unmodelled") or {}
    not_modelled = raw.get("not_modelled") or []
    if not isinstance(unmodelled, dict) or not isinstance(not_modelled, list):
        raise InputError("malformed estimate record", file=path, column=f"{KEY}.unmodelled",
                         expected="an object of operator: reason, and a list of texts", found=unmodelled)
    total = raw.get("total_memory")
    device = str(raw["device"])
    platform = {"device_name": ESTIMATED + device, "total_memory": total if type(total) is int else None,
                "compute": raw["compute"], "framework": f"torch {raw['torch']}", "allocator": raw["allocator"]}
    workspaces = raw.get("workspaces")
    workspaces = workspaces if isinstance(workspaces, dict) else {}
    made = (f"an estimate for {device}, made on a machine without it (memgate.estimate, torch {raw['torch']}, "
            f"allocator settings {raw['allocator'] or 'the defaults'}): the caching allocator's rules replayed over "
            "the storages the program created")
    notes = [made,
             f"cuBLAS workspaces: {workspaces.get('sizes', 'unknown')}",
             "not modelled: " + "; ".join(str(x) for x in not_modelled)]
    out: dict[str, Any] = {"estimate": dict(raw), "platform": {"*": platform}, "notes": notes}
    if type(total) is int and total > 0:  # a limit written as a share of the device ("92%") resolves against it
        out["device_capacity_bytes"] = {DEVICE: total}
    if unmodelled:
        why = "an estimate cannot follow " + "; ".join(f"{op} ({reason})" for op, reason in sorted(unmodelled.items()))
        out["not_measurable"] = not_measurable({Fact.HISTORY: why})  # every figure comes from the replayed history
    return out


def tracked(path: Path, snapshot: Any) -> categories.Tracked | None:
    """The storages an estimate tracked (the recording manifest's ``tracked`` record, with block
    addresses), validated as a manifest's is; None where it tracked nothing."""
    raw = snapshot.get(KEY) if isinstance(snapshot, dict) else None
    record = raw.get("tracked") if isinstance(raw, dict) else None
    if record is None:
        return None
    import jsonschema  # here: only an estimate that tracked models is checked with it

    schema = load_schema("recording")["properties"]["tracked"]
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(record))
    if error is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        raise InputError(f"malformed estimate record: {error.message[:160]}", file=path,
                         column=f"{KEY}.tracked{where}", expected="the storages memgate.estimate tracked")
    return categories.Tracked.of(record)


def with_categories(models: list[DeviceModel], record: categories.Tracked, moments: dict[int, int],
                    steps: Table) -> list[DeviceModel]:
    """Each device's blocks attributed to the tracked categories (:mod:`memgate.categories`)."""
    return [categories.attribute(model, record, moments, model.steps if model.steps is not None else steps)[0]
            for model in models]
