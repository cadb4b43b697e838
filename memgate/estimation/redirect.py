"""Run code written for CUDA on a CPU-only machine without allocating its memory, and note every storage.

:func:`make_modes` builds two torch modes (torch is passed in: never imported here):

- a ``TorchFunctionMode`` that sends every tensor meant for CUDA to the ``meta`` device (a tensor with a
  shape and a dtype, and no memory): the ``device=`` of factories (``torch.randn(..., device="cuda")``),
  ``.to("cuda")`` / ``.cuda()`` of tensors and so of modules (``nn.Module.to`` moves each tensor by its
  ``.to``). What asks a meta tensor for its values (``.item()``, ``.tolist()``, ``.cpu()``) gets zeros:
  an estimate computes sizes, never values, and says so.
- a ``TorchDispatchMode`` that sees every operator torch runs (the autograd engine's too) and notes, in
  order, each meta storage it creates (its bytes) and each one that died since the last operator
  (storages are watched by weak reference to torch's storage, not to a Python tensor, so a tensor that
  autograd saved keeps its storage alive as it does on the GPU). It also models what the CUDA kernels
  allocate that meta kernels do not (:mod:`memgate.estimation.workspaces`), and names the operators whose
  CUDA kernels allocate otherwise than it can see (:data:`UNMODELLED`).

The defaults torch picks for CUDA tensors are kept: the optimizers' ``foreach`` implementation is
chosen for meta tensors as it is for CUDA ones (torch's device lists are patched while the modes run).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from memgate.estimation.allocator import Event

# Operators whose CUDA kernels allocate what their meta kernels do not show (workspaces sized by the
# kernel's launch, fused multi-tensor buffers): an estimate through them is not measurable.
UNMODELLED = {
    "_fused_adam": "fused Adam/AdamW (fused=True) allocate in their CUDA kernels what no meta kernel shows",
    "_fused_adamw": "fused Adam/AdamW (fused=True) allocate in their CUDA kernels what no meta kernel shows",
    "_fused_sgd": "fused SGD (fused=True) allocates in its CUDA kernel what no meta kernel shows",
    "_fused_adagrad": "fused Adagrad (fused=True) allocates in its CUDA kernel what no meta kernel shows",
    "_scaled_dot_product_flash_attention": "the SDPA flash backend's CUDA workspace depends on the kernel chosen",
    "_scaled_dot_product_efficient_attention": "the SDPA memory-efficient backend's CUDA workspace depends on the kernel",
    "_scaled_dot_product_cudnn_attention": "the SDPA cuDNN backend allocates cuDNN workspaces",
    "_scaled_dot_product_fused_attention_overrideable": "a fused SDPA backend allocates in its kernel",
    "_flash_attention_forward": "the flash attention kernel's workspace depends on the kernel chosen",
    "_efficient_attention_forward": "the memory-efficient attention kernel's workspace depends on the kernel",
    "cudnn_convolution": "cuDNN convolutions allocate workspaces sized by the algorithm cuDNN picks",
    "cudnn_batch_norm": "cuDNN batch norm allocates a reserve space sized by cuDNN",
    "_cudnn_rnn": "cuDNN RNNs allocate workspaces sized by cuDNN",
}
# The same, seen as the torch function the user's code calls (its CUDA backends are picked below the dispatch mode:
# on meta tensors torch would take another path, whose allocations are not the GPU's).
UNMODELLED_FUNCTIONS = {
    "scaled_dot_product_attention": "scaled_dot_product_attention picks a CUDA backend (flash, memory-efficient, "
                                    "cuDNN) whose allocations no meta kernel shows",
}

def is_cuda(device: Any) -> bool:
    text = str(device) if device is not None else ""
    return text == "cuda" or text.startswith("cuda:")


def _to_meta(value: Any) -> Any:
    return "meta" if is_cuda(value) else value


class Storages:
    """The order of storage births and deaths the dispatch mode saw (``events``), and the notes taken."""

    def __init__(self, torch: Any, workspaces: Any, frames: Callable[[], list[dict[str, Any]]]) -> None:
        self._torch = torch
        self._weak: Any = torch.multiprocessing.reductions.StorageWeakRef
        self.live: dict[int, tuple[Any, int]] = {}  # storage key -> (weak ref, id of its event)
        self.events: list[Event] = []
        self.unmodelled: dict[str, str] = {}  # operator -> why
        self.zeros = False  # whether values were asked of a meta tensor
        self.workspaces = workspaces
        self._frames = frames
        self._next = 0

    def alloc(self, size: int, key: int | None = None, ref: Any = None, what: str = "") -> int:
        ident = self._next
        self._next += 1
        self.events.append(Event("alloc", ident, size, self._frames(), what))
        if key is not None:
            self.live[key] = (ref, ident)
        return ident

    def free(self, ident: int) -> None:
        self.events.append(Event("free", ident, 0, [], ""))

    def poll(self) -> None:
        """Note the storages that died since the last look (in the order they were born)."""
        dead = [key for key, (ref, _) in self.live.items() if ref.expired()]
        for key in dead:
            self.free(self.live.pop(key)[1])

    def mark(self, name: str) -> None:
        self.poll()
        self.events.append(Event("mark", -1, 0, [], name))

    def outputs(self, out: Any, op: str) -> None:
        stack = [out]
        while stack:
            item = stack.pop()
            if isinstance(item, (list, tuple)):
                stack.extend(reversed(item))
            elif isinstance(item, self._torch.Tensor) and item.device.type == "meta":
                storage = item.untyped_storage()
                key = int(storage._cdata)
                size = int(storage.nbytes())
                known = self.live.get(key)
                if known is not None and not known[0].expired():
                    continue
                if known is not None:  # the same address, a new storage: the old one died
                    self.free(self.live.pop(key)[1])
                if size:
                    self.alloc(size, key, self._weak(storage), op)


def make_modes(torch: Any, storages: Storages) -> tuple[Any, Any]:
    """(function mode, dispatch mode) for ``torch`` noting into ``storages`` (module docstring)."""
    function_base = importlib.import_module("torch.overrides").TorchFunctionMode
    dispatch_base = importlib.import_module("torch.utils._python_dispatch").TorchDispatchMode
    Tensor = torch.Tensor
    zeros_of: dict[Any, Callable[[Any], Any]] = {Tensor.item: lambda t: 0 if not t.dtype.is_floating_point else 0.0,
                Tensor.tolist: lambda t: torch.zeros(t.shape, dtype=t.dtype).tolist(),
                Tensor.cpu: lambda t: torch.zeros(t.shape, dtype=t.dtype),
                Tensor.numpy: lambda t: torch.zeros(t.shape, dtype=t.dtype).numpy()}

    class ToMeta(function_base):  # type: ignore[misc, valid-type]  # torch's class, known at run time
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            name = getattr(func, "__name__", "")
            if name in UNMODELLED_FUNCTIONS:
                storages.unmodelled.setdefault(f"torch.nn.functional.{name}", UNMODELLED_FUNCTIONS[name])
            if "device" in kwargs:
                kwargs["device"] = _to_meta(kwargs["device"])
            if func is Tensor.cuda:
                return args[0].to("meta")
            if func is Tensor.to and len(args) > 1:
                args = (args[0], _to_meta(args[1]), *args[2:])
            if func in zeros_of and args and isinstance(args[0], Tensor) and args[0].device.type == "meta":
                storages.zeros = True
                return zeros_of[func](args[0])
            if func is Tensor.to and args and isinstance(args[0], Tensor) and args[0].device.type == "meta" and (
                    str(kwargs.get("device", args[1] if len(args) > 1 else "")) == "cpu"):
                storages.zeros = True
                return torch.zeros(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype)
            return func(*args, **kwargs)

    class Track(dispatch_base):  # type: ignore[misc, valid-type]  # torch's class, known at run time
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            storages.poll()
            name = func.overloadpacket.__name__
            if name.rstrip("_") in UNMODELLED:
                storages.unmodelled.setdefault(f"aten::{name}", UNMODELLED[name.rstrip("_")])
            try:
                out = func(*args, **(kwargs or {}))
            except NotImplementedError as exc:  # no meta kernel: the program cannot run as an estimate
                raise NotImplementedError(f"memgate.estimate: aten::{name} has no meta kernel in torch "
                                          f"{torch.__version__}, so this program cannot be estimated ({exc})") from exc
            storages.outputs(out, f"aten::{name}")
            storages.workspaces.after(name, args, storages)
            return out

    return ToMeta(), Track()


@contextmanager
def cuda_defaults(torch: Any) -> Iterator[None]:
    """While estimating: torch's optimizers pick ``foreach`` (and accept ``fused``) for meta tensors as
    for CUDA ones; ``torch.cuda``'s calls that need a GPU and change no memory figure do nothing."""
    optimizer_module = importlib.import_module("torch.optim.optimizer")

    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        if hasattr(owner, name):
            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, value)

    foreach, fused = optimizer_module._get_foreach_kernels_supported_devices, \
        optimizer_module._get_fused_kernels_supported_devices
    patch(optimizer_module, "_get_foreach_kernels_supported_devices", lambda: [*foreach(), "meta"])
    patch(optimizer_module, "_get_fused_kernels_supported_devices", lambda: [*fused(), "meta"])
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats", "reset_accumulated_memory_stats"):
        patch(torch.cuda, name, lambda *a, **k: None)
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def user_frames(is_user_file: Callable[[str], bool], depth: int = 4) -> list[dict[str, Any]]:
    """The user's frames on the stack, innermost first, as a snapshot's trace entries carry them."""
    frames: list[dict[str, Any]] = []
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and len(frames) < depth:
        code = frame.f_code
        if is_user_file(code.co_filename):
            frames.append({"filename": code.co_filename, "line": frame.f_lineno, "name": code.co_name})
        frame = frame.f_back
    return frames
