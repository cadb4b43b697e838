"""Record a real torch run into a directory memgate reads: a Kineto trace, and snapshots where a GPU is.

    from memgate.record import record

    with record("prof_dir") as rec:
        for batch in loader:
            train_step(batch)
            rec.step()  # once per training step: ProfilerStep#N boundaries

    with record("prof_dir", track=[model, optimizer]) as rec:  # categories at the peak
        ...

What is written:
- ``torch_trace.json``: ``torch.profiler.profile(activities=[CPU], profile_memory=True,
  with_stack=True, with_modules=True)`` with a schedule that records every step from the first (``wait=0, warmup=0``:
  Kineto's warm-up only steadies *timings*; memgate drops its own ``warmup_steps`` from the memory
  metrics), exported as a Chrome trace. Training step k is ``ProfilerStep#k`` (from 0).
  torch.profiler opens one more ``ProfilerStep`` at the last ``step()`` call (or at the start, when
  ``step()`` is never called), which holds no training step, only what runs until recording stops
  (a test's locals being freed): its span is removed from the exported trace, so the last step
  memgate sees is the last training step. (Its memory events stay, outside any step.)
  ``with_stack`` adds the Python functions that ran (``python_function`` events):
  :func:`allocation_stacks` names the user functions that were running when a block was allocated.
  Kineto's Python tracer records where each function *starts* (its ``def`` line), not the line
  inside it: a holder is placed in a function, not on a line. ``with_modules`` adds an
  ``nn.Module: Name_k`` span around each module's call: the loader makes the modules around an
  allocation its block's owner (``owner_bytes_at_peak``, ``owner_caps``).
- ``cuda_snapshot.pickle`` (CUDA available) / ``npu_snapshot.pickle`` (torch_npu available):
  ``_record_memory_history`` while recording, ``_dump_snapshot`` at the end.
- ``memgate_recording.json`` (:data:`RECORDING_MANIFEST`), written last (atomically): what was recorded
  (manifest version, memgate and torch versions, the number of ``step()`` calls, the trace's and the
  snapshots' file names with each snapshot's ``max_entries``) and ``device_memory``: the process's
  CUDA device memory, which holds what torch's caching allocator never sees (the CUDA context, NCCL,
  cuBLAS workspaces). :class:`DeviceMemorySampler` samples each torch-visible device (``cuda:i``)
  when the profiler has started, after each ``step()`` and before the profiler stops, only where
  CUDA is already initialized (sampling never creates a CUDA context). Its source is NVML
  (``pip install 'pytest-memgate[nvml]'``): this process's own bytes (``scope: process``), or the whole
  device's used memory where NVML cannot attribute memory to this process (a container's PID
  namespace; ``scope: device``, with a ``note`` saying why); without NVML,
  ``torch.cuda.device_memory_used`` (device-wide); ``null`` where neither is available or CUDA was
  never initialized. Sampling never breaks a recording: an NVML error stops it, the samples taken
  so far are kept and the ``note`` says why.
  ``tracked`` (only where :meth:`Recorder.track` was given models or optimizers): the storages of
  their parameters, buffers, gradients and optimizer state, noted at each step end, around each
  optimizer step and at the stop, each moment marked in the trace by a ``memgate::note#<k>`` span
  (:mod:`memgate.tracking`); the loader attributes the blocks live at the peak to them
  (``category_bytes_at_peak``).

torch is imported only when recording starts (``pip install 'pytest-memgate[torch]'``), pynvml only when
the first device-memory sample is taken.

In pytest, the plugin's ``memgate_record`` fixture yields a started :class:`Recorder` writing into
``memgate_profile_dir``; the plugin stops it right after the test body, *before* the marker gates
that directory (fixture teardown would be too late).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import json
import os
import platform as _platform
import re
import sys
import sysconfig
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, Self

from memgate import __version__ as MEMGATE_VERSION
from memgate.allocation_lines import make_mode, span_frames
from memgate.owners import KINETO_FRAME, OWNER_FRAME, frame_owner
from memgate.platforms import conf_text
from memgate.readers.jsonstream import escape_names
from memgate.tracking import StorageTracker, TracksStorages

TRACE_NAME = "torch_trace.json"
CUDA_SNAPSHOT = "cuda_snapshot.pickle"
NPU_SNAPSHOT = "npu_snapshot.pickle"
RECORDING_MANIFEST = "memgate_recording.json"
MANIFEST_VERSION = 1  # "memgate_recording" in the manifest: bumped when its meaning changes
_SNAPSHOT_DEVICE = {CUDA_SNAPSHOT: "cuda", NPU_SNAPSHOT: "npu"}
_FOREVER = 1 << 30  # "active" steps of the schedule: record every step until stop()


def _torch() -> ModuleType:
    try:
        return importlib.import_module("torch")
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        raise ModuleNotFoundError("memgate.record records a torch run and needs torch: pip install "
                                  "'pytest-memgate[torch]'", name="torch") from None


class Recorder(TracksStorages):
    """Profiles a torch run into ``directory``; call :meth:`step` once per training step."""

    def __init__(self, directory: str | Path, *, warmup: int = 0, snapshots: bool = True,
                 max_entries: int = 100_000, record_shapes: bool = False, with_stack: bool = True,
                 with_modules: bool = True, track: Any = (), allocation_lines: bool = True) -> None:
        self.directory = Path(directory)
        self.warmup = warmup
        self.snapshots = snapshots
        self.max_entries = max_entries
        self.record_shapes = record_shapes
        self.with_stack = with_stack
        self.with_modules = with_modules
        self.allocation_lines = allocation_lines  # memgate.allocation_lines: the line of each allocation
        self._lines: Any = None  # the torch function mode while it records
        self.files: list[Path] = []
        self.steps = 0
        self.memory_events: int | None = None  # [memory] events in the trace, once stopped
        self._profiler: Any = None
        self._memory: list[tuple[Any, Path]] = []  # (torch.cuda.memory-like module, snapshot path)
        self._snapshots: list[dict[str, Any]] = []  # the manifest's "snapshots": those written
        self._sampler: DeviceMemorySampler | None = None
        self._torch_version: str | None = None
        self._platform: dict[str, dict[str, Any]] | None = None  # the manifest's "platform", found at the start
        self._stopped = False
        super().__init__(track)
        # The out-of-memory error that stopped the recording (the manifest's "out_of_memory"), and the
        # snapshots dumped at it by torch's out-of-memory observer (kept: not dumped again at the stop)
        self.out_of_memory: dict[str, Any] | None = None
        self._dumped_at_oom: set[Path] = set()

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> Self:
        if self._profiler is not None:
            return self
        torch = _torch()
        from torch.profiler import ProfilerActivity, profile, schedule

        tracker = StorageTracker(torch)
        self._start_tracking(tracker)
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.snapshots:
            self._start_memory_history(torch)
        trace = self.directory / TRACE_NAME

        def export(prof: Any) -> None:
            prof.export_chrome_trace(str(trace))
            if trace not in self.files:
                self.files.append(trace)

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*warmup.*")  # no warm-up on purpose (see above)
            self._profiler = profile(
                activities=[ProfilerActivity.CPU],
                profile_memory=True,
                record_shapes=self.record_shapes,
                with_stack=self.with_stack,
                with_modules=self.with_modules,
                schedule=schedule(wait=0, warmup=self.warmup, active=_FOREVER, repeat=1),
                on_trace_ready=export,
            )
            with _without_profiler_chatter():
                self._profiler.__enter__()
        if self.allocation_lines:
            self._lines = make_mode(torch, user_file_test())
            self._lines.__enter__()
        self._torch_version = str(torch.__version__)
        self._platform = platform_record(torch)
        self._sampler = DeviceMemorySampler(torch)
        self._sampler.sample()
        tracker.active = True
        _RECORDING.append(self)
        return self

    def step(self) -> None:
        """End of one training step (the profiler's ``prof.step()``)."""
        if self._profiler is None or self._stopped:
            raise RuntimeError("the recorder is not running (call start() or use it as a context manager)")
        self._note_step_end(self.steps)
        self._profiler.step()
        self.steps += 1
        if self._sampler is not None:
            self._sampler.sample()

    def stop(self) -> list[Path]:
        """Stop recording and write the files (idempotent); returns the files written."""
        if self._profiler is None or self._stopped:
            return list(self.files)
        self._stopped = True
        if self in _RECORDING:
            _RECORDING.remove(self)
        try:
            self._stop_lines()
            gc.collect()  # what only a reference cycle held is freed while the profiler sees it (left_allocated)
            self._stop_tracking()
            if self._sampler is not None:
                self._sampler.sample()
            try:
                with _without_profiler_chatter():
                    self._profiler.__exit__(None, None, None)
            finally:
                self._dump_snapshots()
            trace = self.directory / TRACE_NAME
            if trace in self.files:
                # the ProfilerStep opened by the last step() call (by the start, without any)
                self.memory_events = drop_step(trace, self.steps)
            self._write_manifest()
        finally:
            if self._sampler is not None:
                self._sampler.close()
        return list(self.files)

    def _stop_lines(self) -> None:
        """Leave the allocation-lines mode; where user code entered a mode of its own inside it and left
        it entered, torch refuses to pop ours out of order: it is left then (it only adds spans)."""
        lines, self._lines = self._lines, None
        if lines is not None:
            with contextlib.suppress(RuntimeError, AssertionError):
                lines.__exit__(None, None, None)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None and is_out_of_memory(exc):
            self.note_out_of_memory(exc)
            self.stop()
            # re-raised as it was, with where its evidence is
            exc.memgate_recording = str(self.directory)  # type: ignore[attr-defined]
            exc.add_note(f"memgate: the recording up to this out-of-memory error is kept in {self.directory}")
            return
        self.stop()

    # -- out of memory -----------------------------------------------------------------------------

    def note_out_of_memory(self, exc: BaseException) -> dict[str, Any]:
        """What an out-of-memory error that reached the recording says (its manifest's ``out_of_memory``):
        torch's out-of-memory observer's figures where it ran, else the error's message; the step it
        happened in, the allocator's levels where the device can still be asked. Call before :meth:`stop`."""
        parsed = parse_out_of_memory(str(exc))
        oom = self.out_of_memory or {"source": "exception", "t_ns": time.time_ns(), **parsed}
        oom.setdefault("device", parsed.get("device"))
        for key, value in parsed.items():
            oom.setdefault(key, value)
        oom["message"] = _first_line(exc)
        oom["step"] = self.steps  # ProfilerStep#<steps>: the step the last step() call opened
        if oom.get("allocated") is None:
            oom.update(_levels(oom.get("device")))
        self.out_of_memory = oom
        return oom

    def _observed(self, kind: str, device: int, alloc: int, capacity: int, free: int) -> None:
        """torch's out-of-memory observer: the figures, and the snapshot at this very moment."""
        if self._stopped or self.out_of_memory is not None:
            return
        label = f"{kind}:{device}"
        self.out_of_memory = {"source": "observer", "t_ns": time.time_ns(), "device": label, "requested": int(alloc),
                              "device_free": int(free), "capacity": int(capacity), **_levels(label)}
        for memory, path in self._memory:
            if _SNAPSHOT_DEVICE[path.name] == kind:
                memory._dump_snapshot(str(path))
                self._dumped_at_oom.add(path)

    def manifest(self) -> dict[str, Any]:
        """What this recording wrote (the content of :data:`RECORDING_MANIFEST`, see the module docstring)."""
        out = {
            "memgate_recording": MANIFEST_VERSION,
            "memgate_version": MEMGATE_VERSION,
            "torch": self._torch_version,
            "steps": self.steps,
            "trace": TRACE_NAME if self.directory / TRACE_NAME in self.files else None,
            "snapshots": list(self._snapshots),
            "device_memory": self._sampler.manifest() if self._sampler is not None else None,
            "out_of_memory": self.out_of_memory,
        }
        tracked = self._tracker.manifest() if self._tracker is not None else None
        if tracked is not None:
            out["tracked"] = tracked
        if self._platform is not None:
            out["platform"] = self._platform
        return out

    def _write_manifest(self) -> None:
        path = self.directory / RECORDING_MANIFEST
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(manifest_text(self.manifest()), encoding="utf-8")
        os.replace(tmp, path)  # a reader never sees half a manifest
        if path not in self.files:
            self.files.append(path)

    # -- allocator snapshots -----------------------------------------------------------------------

    def _start_memory_history(self, torch: ModuleType) -> None:
        if torch.cuda.is_available():
            self._memory.append((torch.cuda.memory, self.directory / CUDA_SNAPSHOT))
        if importlib.util.find_spec("torch_npu") is not None:
            torch_npu = importlib.import_module("torch_npu")
            if torch_npu.npu.is_available():
                self._memory.append((torch_npu.npu.memory, self.directory / NPU_SNAPSHOT))
        for memory, _ in self._memory:
            memory._record_memory_history(max_entries=self.max_entries)
        _attach_observers(torch)

    def _dump_snapshots(self) -> None:
        for memory, path in self._memory:
            try:
                if path not in self._dumped_at_oom:  # the snapshot at the out-of-memory error stays
                    memory._dump_snapshot(str(path))
                self.files.append(path)
                self._snapshots.append({"file": path.name, "device_type": _SNAPSHOT_DEVICE[path.name],
                                        "max_entries": self.max_entries})
            finally:
                memory._record_memory_history(enabled=None)
        self._memory = []


# ---- out of memory ------------------------------------------------------------------------------

_RECORDING: list[Recorder] = []  # the recorders running in this process, told of an out-of-memory error
_ATTACHED: set[str] = set()  # the device kinds whose allocator calls _on_oom (an observer cannot be removed)


def _attach_observers(torch: ModuleType) -> None:
    """torch's out-of-memory observer (``torch._C._cuda_attach_out_of_memory_observer``, torch_npu's
    ``_npu_attach_out_of_memory_observer``), once per process: the allocator calls it with (device, request,
    capacity or the allowed fraction, free) before it raises, where the snapshot at the error can be dumped."""
    attach = {"cuda": getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)}
    if "torch_npu" in sys.modules:
        attach["npu"] = getattr(getattr(sys.modules["torch_npu"], "_C", None), "_npu_attach_out_of_memory_observer",
                                None)
    for kind, hook in attach.items():
        if kind in _ATTACHED or hook is None or (kind == "cuda" and not torch.cuda.is_available()):
            continue
        try:
            hook(_observer(kind))
        except Exception:  # noqa: BLE001, S112 - no observer: the error itself is the evidence then
            continue
        _ATTACHED.add(kind)


def _observer(kind: str) -> Any:
    def observe(device: int, alloc: int, capacity: int, free: int) -> None:
        for recorder in _RECORDING:
            try:
                recorder._observed(kind, device, alloc, capacity, free)
            except Exception:  # noqa: BLE001, S110 - inside the allocator: never raise, the error follows
                pass
    return observe


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA or NPU out-of-memory error: ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError``), or a
    RuntimeError saying "out of memory" (torch_npu before it raised torch's class)."""
    torch = sys.modules.get("torch")
    kind = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if isinstance(kind, type) and isinstance(exc, kind):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


_SIZE = r"([0-9]+(?:\.[0-9]+)?) ?([KMGTP]i?B|bytes|B)"
_UNITS = {"B": 1, "bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "PiB": 1 << 50,
          "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40, "PB": 1 << 50}
_TRIED = re.compile(r"Tried to allocate " + _SIZE)
_CUDA = re.compile(r"GPU ([0-9]+) has a total capacity of " + _SIZE + r" of which " + _SIZE + r" is free")
_NPU = re.compile(r"\(NPU ([0-9]+); " + _SIZE + r" total capacity; .*?" + _SIZE + r" free")


def _bytes(number: str, unit: str) -> int:
    return round(float(number) * _UNITS[unit])


def parse_out_of_memory(message: str) -> dict[str, Any]:
    """What torch's out-of-memory message says: the request, the device, its capacity and free memory (to the
    2 decimals it prints)."""
    out: dict[str, Any] = {}
    if (tried := _TRIED.search(message)) is not None:
        out["requested"] = _bytes(*tried.groups())
    if (cuda := _CUDA.search(message)) is not None:
        out.update(device=f"cuda:{cuda.group(1)}", capacity=_bytes(cuda.group(2), cuda.group(3)),
                   device_free=_bytes(cuda.group(4), cuda.group(5)))
    elif (npu := _NPU.search(message)) is not None:
        out.update(device=f"npu:{npu.group(1)}", capacity=_bytes(npu.group(2), npu.group(3)),
                   device_free=_bytes(npu.group(4), npu.group(5)))
    return out


def _levels(device: str | None) -> dict[str, Any]:
    """The allocator's allocated and reserved bytes on ``device`` now, where its torch module can say."""
    torch = sys.modules.get("torch")
    if torch is None or device is None or ":" not in device:
        return {}
    kind, index = device.split(":", 1)
    module = getattr(torch, kind, None) if kind == "cuda" else getattr(sys.modules.get("torch_npu"), "npu", None)
    try:
        if module is None or not module.is_initialized():
            return {}
        return {"allocated": int(module.memory_allocated(int(index))), "reserved": int(module.memory_reserved(int(index)))}
    except Exception:  # noqa: BLE001 - a device that cannot be asked: the snapshot or the series says it
        return {}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]


def platform_record(torch: ModuleType) -> dict[str, dict[str, Any]]:
    """Each device's platform (:mod:`memgate.platforms`), as the manifest's ``platform`` keeps it: ``cpu``
    (the host), and each GPU / NPU torch has already initialized (asking an uninitialized one would
    create a context). What cannot be asked is left out (unknown), never an error; the driver is the trace's
    (Kineto's header names it), NVML is not started twice."""
    framework = f"torch {torch.__version__}"
    allocator = conf_text({k: v for k, v in os.environ.items() if k.endswith("ALLOC_CONF")}) or ""
    host = _platform.processor() or _platform.machine()
    out: dict[str, dict[str, Any]] = {"cpu": {"device_name": f"{host} CPU" if host else None, "framework": framework}}
    with contextlib.suppress(Exception):  # a broken driver: the CPU's record only
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            for index in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(index)
                out[f"cuda:{index}"] = {
                    "device_name": str(props.name), "total_memory": int(props.total_memory),
                    "compute": f"{props.major}.{props.minor}",
                    "runtime": f"CUDA {torch.version.cuda}" if torch.version.cuda else None,
                    "framework": framework, "allocator": allocator}
    if importlib.util.find_spec("torch_npu") is not None:
        with contextlib.suppress(Exception):
            torch_npu = importlib.import_module("torch_npu")
            if torch_npu.npu.is_available() and torch_npu.npu.is_initialized():
                soc = getattr(torch_npu.npu, "get_soc_version", None)
                cann = getattr(getattr(torch_npu, "version", None), "cann", None)
                for index in range(torch_npu.npu.device_count()):
                    props = torch_npu.npu.get_device_properties(index)
                    out[f"npu:{index}"] = {
                        "device_name": str(props.name), "total_memory": int(props.total_memory),
                        "compute": str(soc()) if callable(soc) else None, "runtime": f"CANN {cann}" if cann else None,
                        "framework": f"{framework} + torch_npu {torch_npu.__version__}", "allocator": allocator}
    return out


def manifest_text(manifest: dict[str, Any]) -> str:
    """The manifest as JSON, indented, with the tracked moments and storages one row per line (a large
    model's thousands of storages stay a file a person can read)."""
    tracked = manifest.get("tracked")
    if not isinstance(tracked, dict):
        return json.dumps(manifest, indent=2) + "\n"
    rows = {key: tracked[key] for key in ("moments", "storages")}
    text = json.dumps({**manifest, "tracked": {**tracked, "columns": "@columns@", **{key: f"@{key}@" for key in rows}}},
                      indent=2)
    text = text.replace('"@columns@"', json.dumps(tracked["columns"]))
    for key, items in rows.items():
        listed = ",\n".join("      " + json.dumps(item) for item in items)
        text = text.replace(json.dumps(f"@{key}@"), f"[\n{listed}\n    ]" if items else "[]")
    return text + "\n"


# ---- device memory outside the caching allocator ------------------------------------------------

NVML_SOURCE = "nvml"
TORCH_SOURCE = "torch.cuda.device_memory_used"
_WHOLE_DEVICE = "so used_bytes is the whole device's used memory, other processes on it included"


class DeviceMemorySampler:
    """Samples the CUDA device memory of this process on each torch-visible device; :meth:`manifest`
    is the manifest's ``device_memory`` (module docstring).

    The source is chosen at the first sample: NVML (``pynvml``; one ``nvmlInit`` per sampler,
    ``nvmlShutdown`` at :meth:`close`), else ``torch.cuda.device_memory_used`` (device-wide), else
    none. Torch's device ``i`` is found in NVML by its UUID: torch's indices follow
    ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``, NVML's are the driver's.

    With NVML each sample keeps the device's used bytes and this process's own (its entry in
    ``nvmlDeviceGetComputeRunningProcesses``; 0 on a device where it has no context). The recording
    has one scope: ``process`` where NVML attributed memory to this pid, else ``device`` for every
    sample. Once a sample cannot be attributed (``usedGpuMemory`` unavailable, the process list
    failing) the rest are device-wide only; a pid NVML never lists (a container's PID namespace)
    makes the recording device-scope too.
    """

    def __init__(self, torch: ModuleType) -> None:
        self._torch = torch
        self.source: str | None = None  # chosen at the first sample
        self._nvml: ModuleType | None = None  # initialized: shut down at close()
        self._handles: list[Any] = []  # NVML handle of torch's device i
        self._devices = 0
        self._samples: list[dict[str, Any]] = []  # device, t_ns, used_bytes (device), process_bytes
        self._pid_seen = False  # NVML listed this pid, with its bytes, in some sample
        self._unattributed: str | None = None  # why not process scope (then every sample is the device's)
        self._stopped: str | None = None  # why sampling stopped before the recording did
        self._done = False

    def sample(self) -> None:
        """One sample per device, where CUDA is initialized (never creating a context); never raises."""
        if self._done:
            return
        try:
            cuda = self._torch.cuda
            if not (cuda.is_initialized() and cuda.is_available()):
                return
            if self.source is None:
                self._open()
                if self._done:
                    return
            self._take()
        except Exception as exc:  # noqa: BLE001 - sampling never breaks a recording: keep what was taken, say why
            self._done = True
            self._stopped = (f"Sampling stopped after {len(self._samples)} sample(s): {self.source} failed "
                             f"({_describe(exc)}).")

    def close(self) -> None:
        """No more samples; NVML shut down (once)."""
        self._done = True
        nvml, self._nvml = self._nvml, None
        if nvml is not None:
            try:
                nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001, S110 - the samples are taken: a failed shutdown changes nothing
                pass

    def manifest(self) -> dict[str, Any] | None:
        """``{"source", "scope", "note"?, "samples"}``; None where no source was found or CUDA was
        never initialized while recording."""
        if self.source is None:
            return None
        process = self.source == NVML_SOURCE and self._unattributed is None and self._pid_seen
        notes = []
        if not process and self._unattributed is not None:
            notes.append(f"{self._unattributed}, {_WHOLE_DEVICE}.")
        elif not process and self._samples:
            notes.append(f"NVML could not attribute memory to this process (pid {os.getpid()} is not among "
                         f"the devices' compute processes: a container's PID namespace?), {_WHOLE_DEVICE}.")
        if self._stopped is not None:
            notes.append(self._stopped)
        out: dict[str, Any] = {"source": self.source, "scope": "process" if process else "device"}
        if notes:
            out["note"] = " ".join(notes)
        out["samples"] = [{"device": s["device"], "t_ns": s["t_ns"],
                           "used_bytes": s["process_bytes"] if process else s["used_bytes"]} for s in self._samples]
        return out

    def _open(self) -> None:
        cuda = self._torch.cuda
        self._devices = int(cuda.device_count())
        why_not = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the deprecated `pynvml` distribution warns on import
                nvml = importlib.import_module("pynvml")
        except ImportError:
            nvml = None
        if nvml is not None:
            try:
                nvml.nvmlInit()
            except Exception as exc:  # noqa: BLE001 - no NVIDIA driver library (ROCm), a driver/library mismatch
                why_not = f"NVML failed to start ({_describe(exc)})"
            else:
                self._nvml = nvml
                self.source = NVML_SOURCE
                self._handles = [self._handle(i) for i in range(self._devices)]
                return
        if callable(getattr(cuda, "device_memory_used", None)):
            self.source = TORCH_SOURCE
            self._unattributed = (f"{why_not}; " if why_not else "") + (
                "torch.cuda.device_memory_used cannot attribute memory to this process "
                "(pip install 'pytest-memgate[nvml]' can)")
        elif why_not is not None:
            self.source = NVML_SOURCE
            self._done = True
            self._stopped = f"{why_not}: no sample taken."
        else:
            self._done = True  # neither source: device_memory is null

    def _handle(self, index: int) -> Any:
        nvml = self._nvml
        assert nvml is not None
        uuid = getattr(self._torch.cuda.get_device_properties(index), "uuid", None)
        text = str(uuid) if uuid is not None else ""
        if not text:
            return self._handle_by_index(index)
        if text.startswith(("GPU-", "MIG-")):
            return nvml.nvmlDeviceGetHandleByUUID(text)
        try:  # torch prints the bare UUID; NVML names a GPU "GPU-<uuid>", a MIG instance "MIG-<uuid>"
            return nvml.nvmlDeviceGetHandleByUUID("GPU-" + text)
        except nvml.NVMLError:
            return nvml.nvmlDeviceGetHandleByUUID("MIG-" + text)

    def _handle_by_index(self, index: int) -> Any:
        """Without torch's UUID: the device CUDA_VISIBLE_DEVICES names (an index, or a UUID NVML
        knows); unset, the same index (right only under CUDA_DEVICE_ORDER=PCI_BUS_ID or one GPU)."""
        nvml = self._nvml
        assert nvml is not None
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return nvml.nvmlDeviceGetHandleByIndex(index)
        entry = [e.strip() for e in visible.split(",")][index]
        # "²".isdigit() is True and int("²") raises: an index is ASCII digits, anything else a UUID for NVML to judge
        if entry.isascii() and entry.isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(entry))
        return nvml.nvmlDeviceGetHandleByUUID(entry)

    def _take(self) -> None:
        cuda = self._torch.cuda
        for i in range(self._devices):
            t_ns = time.time_ns()
            own = None
            if self._nvml is not None:
                handle = self._handles[i]
                used = int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used)
                if self._unattributed is None:
                    own = self._own_bytes(handle)
            else:
                used = int(cuda.device_memory_used(i))
            self._samples.append({"device": f"cuda:{i}", "t_ns": t_ns, "used_bytes": used, "process_bytes": own})

    def _own_bytes(self, handle: Any) -> int | None:
        """This process's bytes on the device (0 where NVML does not list it); None where NVML cannot
        attribute them, with the reason in ``_unattributed``."""
        assert self._nvml is not None
        try:
            processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception as exc:  # noqa: BLE001 - an old driver without the call: the device's figure stands
            self._unattributed = f"NVML could not list the device's processes ({_describe(exc)})"
            return None
        pid = os.getpid()
        mine = [p for p in processes if getattr(p, "pid", None) == pid]
        if any(getattr(p, "usedGpuMemory", None) is None for p in mine):
            self._unattributed = ("NVML could not attribute memory to this process (it reports no usedGpuMemory "
                                  "for it, as in some containers)")
            return None
        if mine:
            self._pid_seen = True
        return sum(int(p.usedGpuMemory) for p in mine)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_CHATTER = re.compile(rb"^USDT:.*\] profiler_(start|stop)\s*$")  # Kineto's trace points, printed to fd 2


@contextlib.contextmanager
def _without_profiler_chatter() -> Iterator[None]:
    """Keep Kineto's ``USDT: ... profiler_start/stop`` lines out of stderr (a test's captured output): fd 2
    goes to a temporary file while the profiler starts or stops; every other line is written back."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no fd 2 to borrow (an embedded interpreter): nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = b"".join(line for line in held.read().splitlines(keepends=True) if not _CHATTER.match(line))
            if kept:
                os.write(2, kept)


def drop_step(path: Path, number: int) -> int:
    """Remove the ``ProfilerStep#<number>`` spans from a Chrome trace we just exported; return how
    many ``[memory]`` events it holds (none: nothing allocated tensor memory while it recorded).

    Numbers keep their exact text (µs with 3 decimals do not survive a float): the trace is parsed
    with ``Decimal`` and written back by :func:`_dump`; the file is replaced atomically.
    """
    raw = path.read_bytes()
    try:
        data = json.loads(raw, parse_float=Decimal)
        repaired = False
    except json.JSONDecodeError:
        data = json.loads(escape_names(raw), parse_float=Decimal)  # still bad: torch's error stands
        repaired = True
    name = f"ProfilerStep#{number}"
    events = data.get("traceEvents")
    if not isinstance(events, list):
        return 0
    memory = sum(1 for e in events if isinstance(e, dict) and e.get("name") == "[memory]")
    kept = [e for e in events if not (isinstance(e, dict) and e.get("ph") == "X" and e.get("name") == name)]
    if len(kept) == len(events) and not repaired:
        return memory
    data["traceEvents"] = kept
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        _dump(data, fh)
    os.replace(tmp, path)
    return memory


def _dump(value: Any, fh: Any, indent: str = "") -> None:
    if isinstance(value, dict):
        fh.write("{")
        for i, (key, item) in enumerate(value.items()):
            fh.write(("," if i else "") + "\n" + indent + "  " + json.dumps(key) + ": ")
            _dump(item, fh, indent + "  ")
        fh.write("\n" + indent + "}")
    elif isinstance(value, list):
        fh.write("[")
        for i, item in enumerate(value):
            fh.write(("," if i else "") + "\n" + indent + "  ")
            _dump(item, fh, indent + "  ")
        fh.write("\n" + indent + "]")
    elif isinstance(value, Decimal):
        fh.write(str(value))
    else:
        fh.write(json.dumps(value))


def record(directory: str | Path, **options: Any) -> Recorder:
    """A :class:`Recorder` for ``with record(dir) as rec: ...; rec.step()``."""
    return Recorder(directory, **options)


# ---- where the holders were allocated ---------------------------------------------------------

STACK_DEPTH = 4  # user frames kept per holder, innermost first


def _library_dirs() -> tuple[str, ...]:
    """Code that is not the user's: the standard library, installed packages and their scripts,
    torch, memgate itself."""
    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib", "scripts")}
    dirs.add(str(Path(sys.executable).parent))  # console scripts (pytest) of the environment
    dirs.add(str(Path(__file__).resolve().parent))
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        dirs.add(str(Path(spec.origin).resolve().parent))
    return tuple(str(Path(d).resolve()) + os.sep for d in dirs if d)


def _is_user_file(file: str, library: tuple[str, ...]) -> bool:
    """Whether ``file`` is the user's code: not the standard library, an installed package, torch or memgate."""
    if file.startswith("<"):
        return False
    resolved = str(_resolve(file))
    return not (resolved.startswith(library) or f"{os.sep}site-packages{os.sep}" in resolved
                or f"{os.sep}dist-packages{os.sep}" in resolved)


def user_file_test() -> Callable[[str], bool]:
    """Whether a file is the user's code, with the library folders looked up once (the recorder's
    allocation lines and the estimator's storage owners share it)."""
    library = _library_dirs()
    return lambda file: _is_user_file(file, library)


def user_frame(name: str, library: tuple[str, ...]) -> tuple[str, int, str] | None:
    """(file, line, function) of a ``python_function`` event name like ``model.py(12): forward``, when
    the file is the user's code (not the standard library, an installed package, torch or memgate)."""
    match = KINETO_FRAME.match(name)
    if match is None or match.group("file").startswith("<"):
        return None
    file = match.group("file")
    resolved = str(_resolve(file))
    if resolved.startswith(library) or f"{os.sep}site-packages{os.sep}" in resolved \
            or f"{os.sep}dist-packages{os.sep}" in resolved:
        return None
    return file, int(match.group("line")), match.group("function")


def _resolve(file: str) -> Path:
    """The file a frame names: the tracer writes paths under a ``sys.path`` entry relative to it
    (``_pytest/python.py``, ``test_model.py``), so a relative name is looked up there (the recording
    ran in this process)."""
    path = Path(file)
    if not path.is_absolute():
        for entry in sys.path:
            candidate = Path(entry or ".") / path
            if candidate.is_file():
                return candidate.resolve()
    return path.resolve()


def _ns(ts: Any, base: int) -> int:
    return int((Decimal(ts) * 1000).to_integral_value()) + base


def allocation_stacks(trace: Path, holders: list[dict[str, Any]]) -> list[list[str]]:
    """For each holder (``{"size", "t_alloc", ...}`` of ``top_at_peak``), the user functions that were
    running when it was allocated, innermost first (``forward (model.py:30)``): each at the line it was
    executing where the recording noted it (:mod:`memgate.allocation_lines`), else where the function
    starts (Kineto's Python frames). Empty where the trace has no Python frames (recorded without ``with_stack``),
    the holder was allocated before the window, or only library code ran.

    Reads a trace :class:`Recorder` wrote (trusted, our own): the allocation is the ``[memory]``
    event of the holder's size at its ``t_alloc``; its frames are the ``python_function`` spans of
    the same thread that contain it.
    """
    data = json.loads(trace.read_bytes(), parse_float=Decimal)
    base = data.get("baseTimeNanoseconds") or 0
    events = [e for e in data.get("traceEvents") or [] if isinstance(e, dict)]
    wanted = {(h["t_alloc"], h["size"]) for h in holders if h.get("t_alloc") is not None}
    allocs: dict[tuple[int, int], tuple[Any, Any]] = {}
    for e in events:
        args = e.get("args") or {}
        if e.get("name") == "[memory]" and isinstance(args.get("Bytes"), int) and args["Bytes"] > 0:
            key = (_ns(e["ts"], base), args["Bytes"])
            if key in wanted:
                allocs.setdefault(key, (e.get("pid"), e.get("tid")))
    threads = set(allocs.values())
    lines: dict[tuple[Any, Any], list[tuple[int, int, list[str]]]] = {}  # memgate::at spans: the exact lines
    for e in events:
        frames = span_frames(str(e.get("name", ""))) if e.get("ph") == "X" else None
        if frames and (e.get("pid"), e.get("tid")) in threads:
            start = _ns(e["ts"], base)
            lines.setdefault((e.get("pid"), e.get("tid")), []).append((start, start + _ns(e.get("dur", 0), 0), frames))
    library = _library_dirs()
    spans: dict[tuple[Any, Any], list[tuple[int, int, str]]] = {}
    for e in events:
        if e.get("cat") == "python_function" and e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in threads:
            frame = user_frame(str(e.get("name", "")), library)
            if frame is not None:
                start = _ns(e["ts"], base)
                text = frame_owner(*frame)
                spans.setdefault((e.get("pid"), e.get("tid")), []).append((start, start + _ns(e.get("dur", 0), 0), text))
    stacks: list[list[str]] = []
    for h in holders:
        thread = allocs.get((h.get("t_alloc"), h.get("size")))  # type: ignore[arg-type]
        t = h.get("t_alloc")
        if thread is None or t is None:
            stacks.append([])
            continue
        at = [span for span in lines.get(thread, []) if span[0] <= t <= span[1]]
        if at:  # the innermost torch call of the user's code around it: its lines
            stacks.append(max(at, key=lambda span: (span[0], -span[1]))[2][:STACK_DEPTH])
            continue
        running = sorted((s for s in spans.get(thread, []) if s[0] <= t <= s[1]), key=lambda s: (s[0], -s[1]))
        stacks.append([text for _, _, text in reversed(running)][:STACK_DEPTH])
    return stacks


def with_allocation_stacks(trace: Path, holders: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``holders`` with ``stack`` (user functions, innermost first) and, where no module owns the block, an
    ``owner`` (the innermost user function) — for a recording's failure detail and report."""
    out = []
    for holder, stack in zip(holders, allocation_stacks(trace, holders)):
        entry = dict(holder)
        if stack:
            entry["stack"] = stack
            # a frame owner becomes the stack's innermost frame (the same spelling); a module path stays
            owner = entry.get("owner")
            entry["owner"] = stack[0] if not owner or OWNER_FRAME.match(str(owner)) else owner
        out.append(entry)
    return out
