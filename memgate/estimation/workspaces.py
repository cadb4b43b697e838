"""What CUDA libraries allocate through the caching allocator that no meta kernel shows: cuBLAS workspaces.

torch gives each cuBLAS handle (one per thread and stream: the thread running the forward and the autograd
engine's thread for the device are two) a workspace from the caching allocator the first time the thread
runs a cuBLAS operator, and keeps it allocated for the process's life; cuBLASLt operators (``addmm`` with a
bias, torch's fused linear) add a workspace of their own per thread. Sizes per device and torch release:
:data:`KNOWN`, measured on the device; elsewhere torch's documented defaults (``CUBLAS_WORKSPACE_CONFIG``
``:4096:8`` on Hopper, ``:4096:2:16:8`` before, ``TORCH_CUBLASLT_WORKSPACE_SIZE`` 1 MiB), said so.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

MIB = 1 << 20
# cuBLAS operators: each needs its thread's handle (and workspace)
CUBLAS_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "_addmm_activation",
                        "_scaled_mm", "_int_mm"})
LT_OPS = frozenset({"_addmm_activation"})  # always cuBLASLt; addmm with a 1-D bias goes there too


@dataclass(frozen=True)
class Device:
    """A CUDA device an estimate can be made for."""

    name: str
    total_memory: int
    compute: str  # compute capability


DEVICES = {
    "NVIDIA H200": Device("NVIDIA H200", 143_771 * MIB, "9.0"),
    "NVIDIA H100 80GB HBM3": Device("NVIDIA H100 80GB HBM3", 81_559 * MIB, "9.0"),
    "NVIDIA A100-SXM4-80GB": Device("NVIDIA A100-SXM4-80GB", 81_920 * MIB, "8.0"),
    "NVIDIA A100-SXM4-40GB": Device("NVIDIA A100-SXM4-40GB", 40_960 * MIB, "8.0"),
    "NVIDIA L4": Device("NVIDIA L4", 23_034 * MIB, "8.9"),
}
DEFAULT_DEVICE = "NVIDIA H200"
# (device name, torch major.minor) -> (cuBLAS, cuBLASLt) workspace bytes, measured by torch.cuda on the device
KNOWN = {("NVIDIA H200", "2.11"): (32 * MIB, 1 * MIB)}


def _config_bytes(text: str) -> int | None:
    """``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE_KIB:COUNT`` pairs) in bytes; None where it is no such text."""
    pairs = re.findall(r":(\d+):(\d+)", text)
    if not pairs or "".join(f":{a}:{b}" for a, b in pairs) != text.strip():
        return None
    return sum(int(a) * 1024 * int(b) for a, b in pairs)


def sizes(device: Device, torch_version: str, environ: dict[str, str] | None = None) -> tuple[int, int, str]:
    """(cuBLAS workspace, cuBLASLt workspace, where these figures come from)."""
    env = dict(os.environ if environ is None else environ)
    release = ".".join(torch_version.split("+")[0].split(".")[:2])
    hopper = device.compute.startswith(("9.", "10.", "12."))
    blas, lt = (32 * MIB if hopper else 8 * MIB + 128 * 1024), 1 * MIB
    source = (f"torch's defaults for compute capability {device.compute} (not measured on {device.name} with "
              f"torch {release})")
    if (device.name, release) in KNOWN:
        blas, lt = KNOWN[(device.name, release)]
        source = f"measured on {device.name} with torch {release}"
    given = _config_bytes(env.get("CUBLAS_WORKSPACE_CONFIG", ""))
    if given is not None:
        blas, source = given, source + "; cuBLAS workspace from CUBLAS_WORKSPACE_CONFIG"
    if env.get("TORCH_CUBLASLT_WORKSPACE_SIZE", "").isdigit():
        lt, source = int(env["TORCH_CUBLASLT_WORKSPACE_SIZE"]) * 1024, source + "; cuBLASLt from its variable"
    return blas, lt, source


class Workspaces:
    """Allocates the workspaces as the operators that need them run (:meth:`after` an operator)."""

    def __init__(self, torch: Any, blas: int, lt: int) -> None:
        self._torch = torch
        self.blas, self.lt = blas, lt
        self._have: set[tuple[str, str]] = set()  # (thread, kind)
        self.seen: list[str] = []  # what was allocated, for the estimate's assumptions

    def after(self, op: str, args: Any, storages: Any) -> None:
        if op not in CUBLAS_OPS:
            return
        # the autograd engine runs a CUDA backward on its own thread (a cuBLAS handle of its own)
        thread = "backward" if self._torch._C._current_autograd_node() is not None else "forward"
        kinds = ["cublas"]
        if op in LT_OPS or (op == "addmm" and len(args) > 0 and getattr(args[0], "dim", lambda: 0)() == 1):
            kinds.append("cublaslt")
        for kind in kinds:
            if (thread, kind) in self._have:
                continue
            self._have.add((thread, kind))
            size = self.blas if kind == "cublas" else self.lt
            if size:
                storages.alloc(size, what=f"{kind} workspace ({thread} thread)")
                self.seen.append(f"{kind} workspace of {size} B for the {thread} thread")
