"""The platform a device's figures were measured on, and when two platforms' histories compare.

A platform is what the allocator's numbers depend on besides the model: the device (its name, its
memory, its compute capability or SoC), the driver and the CUDA / CANN release, the framework
(torch, torch_npu, MindSpore) and the allocator's settings (``PYTORCH_CUDA_ALLOC_CONF``, ...). A
field the profile does not carry is unknown (None; "unknown" where it is shown).

Loaders write what their files carry into a profile's ``metadata["platform"]``: device label (or
``"*"``: every device of the profile) → a partial record (:data:`FIELDS`); the framework and CANN
versions, and the allocator conf a snapshot records, are read from the metadata keys the loaders
already write (:func:`device_platform`).

Two platforms are **the same** (:meth:`Platform.same_as`) when every field of :data:`MATCHED` that
both know is equal: device name, total memory, framework release (major.minor: a patch release or a
local build tag such as ``+cu128`` does not change the allocator) and allocator settings. The driver,
the CUDA / CANN release and the compute capability are recorded, never matched (a driver patch on the
same GPU, or a capability the name implies). A platform that knows nothing (a saved run from before
memgate recorded platforms) compares with any, and the comparison says so.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

FIELDS = ("device_name", "total_memory", "compute", "driver", "runtime", "framework", "allocator")
MATCHED = ("device_name", "total_memory", "framework", "allocator")
UNKNOWN = "unknown"
COMPARE_MODES = ("same", "any")
_RELEASE = re.compile(r"\b([0-9]+)\.([0-9]+)(?:\.[0-9A-Za-z]+)*(?:\+[0-9A-Za-z._]+)?")
_FRAMEWORK_KEYS = (("torch_version", "torch"), ("torch_npu_version", "torch_npu"), ("mindspore_version", "mindspore"),
                   ("ms_version", "mindspore"))


@dataclass(frozen=True)
class Platform:
    device_name: str | None = None  # "NVIDIA H200", "Ascend910B2", "x86_64 CPU"
    total_memory: int | None = None  # bytes
    compute: str | None = None  # CUDA compute capability "9.0", or the NPU's SoC version
    driver: str | None = None  # "CUDA driver 13.0", an NPU driver release
    runtime: str | None = None  # "CUDA 13.0", "CANN 8.3.RC1"
    framework: str | None = None  # "torch 2.13.0", "torch_npu 2.7.1", "mindspore 2.1.0"
    allocator: str | None = None  # the *ALLOC_CONF text ("": the defaults)

    @classmethod
    def of(cls, record: Any) -> Platform:
        """A platform from its JSON record (a saved run's, a report's); what is not one: unknown."""
        if not isinstance(record, Mapping):
            return cls()
        total = record.get("total_memory")
        texts = {name: _text(record.get(name)) for name in FIELDS if name != "total_memory"}
        return cls(total_memory=total if type(total) is int and total >= 0 else None, **texts)

    def as_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in FIELDS}

    @property
    def known(self) -> bool:
        return any(getattr(self, name) is not None for name in FIELDS)

    def label(self) -> str:
        """``NVIDIA H200 / torch 2.11``: the device and the framework release, ``unknown`` for either
        the profile does not carry; a non-default allocator conf is added."""
        if not self.known:
            return UNKNOWN
        text = f"{self.device_name or 'unknown device'} / {_short(self.framework) or 'unknown framework'}"
        return text + (f" ({self.allocator})" if self.allocator else "")

    def same_as(self, other: Platform) -> bool:
        """Whether histories of the two compare (module docstring); unknown compares with any."""
        if not self.known or not other.known:
            return True
        for name in MATCHED:
            a, b = getattr(self, name), getattr(other, name)
            if name == "framework":
                a, b = _short(a), _short(b)
            if a is not None and b is not None and a != b:
                return False
        return True

    def differences(self, other: Platform) -> list[str]:
        """``device_name 'NVIDIA A100' -> 'NVIDIA H200'``, one per matched field that differs."""
        out = []
        for name in MATCHED:
            a, b = getattr(other, name), getattr(self, name)
            if a is not None and b is not None and (_short(a) != _short(b) if name == "framework" else a != b):
                out.append(f"{name} {a!r} -> {b!r}")
        return out


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    text = str(value).strip()
    return None if text.lower() == UNKNOWN else text


def _short(framework: Any) -> str | None:
    """``torch 2.11.0+cu128`` → ``torch 2.11``: the release a comparison matches."""
    if not isinstance(framework, str):
        return None
    return _RELEASE.sub(lambda m: f"{m.group(1)}.{m.group(2)}", framework)


def conf_text(conf: Any) -> str | None:
    """The allocator settings as one text: the ``*ALLOC_CONF`` values (a snapshot's ``allocator_settings``
    conf, an environment), each ``key:value`` entry sorted; "" where set to nothing; None where unknown."""
    if isinstance(conf, Mapping):
        values = [str(v) for k, v in sorted(conf.items()) if str(k).endswith("ALLOC_CONF") and v is not None]
        if not values:
            return None
        conf = ",".join(v for v in values if v)
    if not isinstance(conf, str):
        return None
    return ",".join(sorted(part.strip().replace(" ", "") for part in conf.split(",") if part.strip()))


def device_platform(metadata: Mapping[str, Any], device: str) -> Platform:
    """The platform of ``device`` as a profile's metadata carries it (module docstring)."""
    records = metadata.get("platform")
    record: dict[str, Any] = {}
    if isinstance(records, Mapping):
        for key in ("*", device):
            if isinstance(records.get(key), Mapping):
                record.update({k: v for k, v in records[key].items() if v is not None})
    if record.get("framework") is None:
        named = [f"{name} {metadata[key]}" for key, name in _FRAMEWORK_KEYS
                 if isinstance(metadata.get(key), (str, int, float)) and str(metadata.get(key)).strip()]
        if named:
            record["framework"] = " + ".join(dict.fromkeys(named))
    if device == "cpu":  # the CANN release and the allocator conf a profile names are its accelerator's
        return Platform.of(record)
    if record.get("runtime") is None and isinstance(metadata.get("cann_version"), str) and metadata["cann_version"]:
        record["runtime"] = f"CANN {metadata['cann_version']}"
    if record.get("allocator") is None:
        confs = [metadata.get("alloc_conf")] + [s.get("alloc_conf") for s in (metadata.get("snapshots") or {}).values()
                                                if isinstance(s, Mapping)]
        for conf in confs:
            if (text := conf_text(conf)) is not None:
                record["allocator"] = text
                break
    return Platform.of(record)


def primary(platforms: Iterable[tuple[str, Platform]]) -> Platform:
    """A profile's platform as a comparison names it: its first accelerator's that is known, else its
    first device's that is known, else unknown."""
    items = list(platforms)
    for accelerator in (True, False):
        for device, platform in items:
            if platform.known and (device != "cpu") == accelerator:
                return platform
    return Platform()


def entry_platform(entry: Mapping[str, Any]) -> Platform:
    """The platform of a report's profile entry, or of a baseline's entry (:func:`primary` of its devices')."""
    return primary((str(d.get("device")), Platform.of(d.get("platform"))) for d in entry.get("devices") or []
                   if isinstance(d, Mapping))
