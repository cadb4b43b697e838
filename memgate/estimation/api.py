"""Estimate on a CPU-only machine what a CUDA run would record: ``memgate.estimate`` and the estimator the
``memgate_record`` fixture yields under ``--memgate-estimate=cuda[:DEVICE NAME]``.

    import memgate

    with memgate.estimate("prof_dir", device="NVIDIA H200") as est:
        model = build().cuda()            # code written for CUDA runs unchanged
        for batch in loader:
            train_step(model, batch)
            est.step()                    # once per training step, as with memgate.record

The code runs with every CUDA tensor on torch's ``meta`` device (:mod:`memgate.estimation.redirect`):
shapes and dtypes, no memory, no values. Every storage's birth and death is noted in order and replayed
through the caching allocator's model (:mod:`memgate.estimation.allocator`) with cuBLAS's workspaces
(:mod:`memgate.estimation.workspaces`), and written as a memory snapshot, ``estimated_cuda_snapshot.pickle``:
the file a CUDA recording writes, read by the same loader, so peak allocated and reserved, step growth,
leaks, fragmentation and the holders at the peak with their owners are the figures memgate gives a CUDA
run. The snapshot's ``memgate_estimate`` record says it is an estimate, for which device, under which
assumptions (torch release, allocator settings, workspaces) and what it could not model; an operator whose
CUDA kernel allocates otherwise than the model sees makes the history figures not measurable, with why.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from memgate.categories import NOTE_PREFIX
from memgate.errors import ConfigError, show
from memgate.estimation.allocator import Allocator, Event
from memgate.estimation.tracked import placed
from memgate.estimation.workspaces import DEFAULT_DEVICE, DEVICES, Device, Workspaces, sizes
from memgate.loaders.snapshot.block_sizes import Settings
from memgate.platforms import conf_text
from memgate.tracking import TracksStorages

ESTIMATE_SNAPSHOT = "estimated_cuda_snapshot.pickle"
ESTIMATED = "estimated: "  # a platform's device name for an estimate: "estimated: NVIDIA H200"
NOT_MODELLED = (
    "memory outside the caching allocator (the CUDA context, NCCL, cuDNN and CUDA graph pools)",
    "temporaries that CUDA kernels allocate inside one operator (reduction buffers of a few hundred bytes)",
    "other streams than the default one, and events recorded on them",
)


@dataclass(frozen=True)
class Target:
    """What to estimate for: ``cuda`` (the default device) or ``cuda:NVIDIA H200``."""

    device: Device

    @classmethod
    def parse(cls, text: str) -> Target:
        kind, _, name = text.partition(":")
        if kind.strip() != "cuda":
            raise ConfigError(f"invalid --memgate-estimate {show(text)}",
                              expected="cuda, or cuda:DEVICE with DEVICE one of " + ", ".join(DEVICES))
        name = name.strip() or DEFAULT_DEVICE
        known = {k.lower(): v for k, v in DEVICES.items()}
        if name.lower() not in known:
            raise ConfigError(f"invalid --memgate-estimate {show(text)}: no model of device {show(name)}",
                              expected="a device memgate models: " + ", ".join(DEVICES))
        return cls(known[name.lower()])


def allocator_settings(conf: str) -> Settings:
    """The caching allocator's settings from a ``PYTORCH_CUDA_ALLOC_CONF`` text (``key:value,...``)."""
    raw: dict[str, Any] = {}
    for part in conf.split(","):
        key, _, value = part.strip().partition(":")
        key, value = key.strip(), value.strip()
        if not key:
            continue
        if key == "expandable_segments":
            raw[key] = value.lower() == "true"
        elif key == "max_split_size_mb" and value.isdigit():
            raw["max_split_size"] = int(value) << 20
        elif key == "roundup_power2_divisions" and value.isdigit():
            raw["roundup_power2_divisions"] = [int(value)] * 16
        elif key in ("garbage_collection_threshold", "pinned_use_cuda_host_register", "backend"):
            continue
        else:
            raise ConfigError(f"invalid allocator setting {show(part.strip())} for an estimate",
                              expected="expandable_segments:True|False, max_split_size_mb:N, "
                                       "roundup_power2_divisions:N")
    return Settings.of(raw)


class Estimator(TracksStorages):
    """Runs the code between :meth:`start` and :meth:`stop` on meta tensors and writes the estimate into
    ``directory`` (module docstring); the same calls as :class:`memgate.record.Recorder`."""

    def __init__(self, directory: str | Path, *, device: str = DEFAULT_DEVICE, alloc_conf: str | None = None,
                 track: Any = ()) -> None:
        self.directory = Path(directory)
        self.target = Target.parse(f"cuda:{device}")
        self.alloc_conf = conf_text(os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")) if alloc_conf is None \
            else conf_text(alloc_conf)
        self.settings = allocator_settings(self.alloc_conf or "")
        self.files: list[Path] = []
        self.steps = 0
        self.memory_events: int | None = None
        self.out_of_memory: dict[str, Any] | None = None
        self.estimate: dict[str, Any] | None = None  # the snapshot's memgate_estimate record, once stopped
        self._stack: contextlib.ExitStack | None = None
        self._storages: Any = None
        self._torch_version = ""
        self._compiled: list[str] = []
        self._stopped = False
        super().__init__(track)

    def start(self) -> Self:
        if self._stack is not None:
            return self
        torch = _torch()
        from memgate.estimation import redirect
        from memgate.record import user_file_test

        self._torch_version = str(torch.__version__)
        blas, lt, source = sizes(self.target.device, self._torch_version)
        self._workspace_source = source
        is_user_file = user_file_test()
        self._storages = redirect.Storages(
            torch, Workspaces(torch, blas, lt), lambda: redirect.user_frames(is_user_file))
        from memgate.estimation.tracked import EstimateTracker

        tracker = EstimateTracker(torch, self._storages)
        self._start_tracking(tracker)
        function_mode, dispatch_mode = redirect.make_modes(torch, self._storages)
        stack = contextlib.ExitStack()
        stack.enter_context(redirect.cuda_defaults(torch))
        stack.enter_context(_eager_compile(torch, self._compiled))
        stack.enter_context(function_mode)
        stack.enter_context(dispatch_mode)
        self._stack = stack
        self._storages.mark("start")
        tracker.active = True
        return self

    def step(self) -> None:
        """End of one training step."""
        if self._stack is None or self._stopped:
            raise RuntimeError("the estimator is not running (call start() or use it as a context manager)")
        self._note_step_end(self.steps)
        self._storages.mark("step")
        self.steps += 1

    def stop(self) -> list[Path]:
        """Stop and write the estimate (idempotent); returns the files written."""
        if self._stack is None or self._stopped:
            return list(self.files)
        self._stopped = True
        gc.collect()  # what only a reference cycle held dies while we watch (as Recorder.stop does)
        self._storages.poll()
        self._stop_tracking()
        self._stack.close()
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / ESTIMATE_SNAPSHOT
        snapshot = self.snapshot(self._storages.events)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            pickle.dump(snapshot, fh, protocol=4)
        os.replace(tmp, path)
        self.files.append(path)
        self.memory_events = sum(1 for e in self._storages.events if e.kind == "alloc")
        return list(self.files)

    def snapshot(self, events: list[Event]) -> dict[str, Any]:
        """The memory snapshot the caching allocator's model writes for ``events``."""
        allocator = Allocator(self.settings)
        addresses: dict[int, int] = {}
        address_of: dict[int, int] = {}  # every storage's block address, freed or not (the tracked storages')
        annotations: list[dict[str, Any]] = []
        t_us = 1_000_000
        step = 0
        for event in events:
            t_us += 1
            if event.kind == "alloc":
                frames = [*([{"filename": "??", "line": 0, "name": f"at::_ops::{event.what[6:]}::call"}]
                            if event.what.startswith("aten::") else []), *event.frames]
                addresses[event.ident] = address_of[event.ident] = allocator.malloc(event.size, frames, t_us)
            elif event.kind == "free":
                allocator.free(addresses.pop(event.ident), t_us)
            elif event.what.startswith(NOTE_PREFIX):
                annotations += [{"name": event.what, "stage": stage, "time_us": t_us, "device": 0}
                                for stage in ("START", "END")]
            elif event.what == "start":
                annotations.append({"name": "ProfilerStep#0", "stage": "START", "time_us": t_us, "device": 0})
            else:
                annotations.append({"name": f"ProfilerStep#{step}", "stage": "END", "time_us": t_us, "device": 0})
                step += 1
                annotations.append({"name": f"ProfilerStep#{step}", "stage": "START", "time_us": t_us, "device": 0})
        if annotations and annotations[-1]["stage"] == "START" and step:
            annotations.pop()  # the step the last step() opened holds no training step (as the recorder drops it)
        self.estimate = self._record()
        tracked = placed(self._tracker.manifest() if self._tracker is not None else None, address_of)
        if tracked is not None:
            self.estimate["tracked"] = tracked
        raw_settings = {"PYTORCH_CUDA_ALLOC_CONF": self.alloc_conf or "", "expandable_segments": self.settings.expandable,
                        "max_split_size": -1 if self.settings.max_split_size >= (1 << 62) else self.settings.max_split_size,
                        "roundup_power2_divisions": {str(1 << i): d for i, d in enumerate(self.settings.divisions)}}
        return {"segments": allocator.snapshot_segments(), "device_traces": [allocator.trace],
                "allocator_settings": raw_settings, "external_annotations": annotations,
                "memgate_estimate": self.estimate}

    def _record(self) -> dict[str, Any]:
        storages = self._storages
        unmodelled = dict(storages.unmodelled)
        for where in self._compiled:
            unmodelled[where] = ("torch.compile generates kernels (and CUDA graphs) whose allocations an eager run "
                                 "on meta tensors does not show: the code ran eagerly")
        device = self.target.device
        return {
            "device": device.name, "total_memory": device.total_memory, "compute": device.compute,
            "torch": self._torch_version, "allocator": self.alloc_conf or "",
            "workspaces": {"sizes": self._workspace_source, "allocated": list(storages.workspaces.seen)},
            "unmodelled": unmodelled,
            "not_modelled": [*NOT_MODELLED, *([_ZERO] if storages.zeros else [])],
        }

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


_ZERO = ("values: .item(), .tolist(), .cpu() and .numpy() of an estimated tensor gave zeros, so what depends on "
         "values was estimated on zeros")


def estimate(directory: str | Path, **options: Any) -> Estimator:
    """An :class:`Estimator` for ``with memgate.estimate(dir) as est: ...; est.step()``."""
    return Estimator(directory, **options)


@contextlib.contextmanager
def _eager_compile(torch: Any, compiled: list[str]) -> Any:
    """``torch.compile`` returns the function itself and notes where it was asked (not measurable)."""
    saved = torch.compile

    def compile_(model: Any = None, **kwargs: Any) -> Any:
        compiled.append(f"torch.compile({getattr(model, '__name__', type(model).__name__)})")
        return model if model is not None else (lambda fn: fn)

    torch.compile = compile_
    try:
        yield
    finally:
        torch.compile = saved


def _torch() -> Any:
    try:
        return importlib.import_module("torch")
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        raise ModuleNotFoundError("memgate.estimate runs a torch program and needs torch: pip install "
                                  "'pytest-memgate[torch]'", name="torch") from None
