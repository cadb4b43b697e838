"""Record a real torch run into a directory memgate reads: a Kineto trace, and snapshots where a GPU is.

    from memgate.record import record

    with record("prof_dir") as rec:
        for batch in loader:
            train_step(batch)
            rec.step()  # once per training step: ProfilerStep#N boundaries

What is written:
- ``torch_trace.json``: ``torch.profiler.profile(activities=[CPU], profile_memory=True)`` with a
  schedule that records every step from the first (``wait=0, warmup=0``: Kineto's warm-up only
  steadies *timings*; memgate drops its own ``warmup_steps`` from the memory metrics), exported as
  a Chrome trace. Training step k is ``ProfilerStep#k`` (from 0). torch.profiler opens one more
  ``ProfilerStep`` at the last ``step()`` call, which holds no training step, only what runs until
  recording stops (a test's locals being freed): its span is removed from the exported trace, so
  the last step memgate sees is the last training step. (Its memory events stay, outside any step.)
- ``cuda_snapshot.pickle`` (CUDA available) / ``npu_snapshot.pickle`` (torch_npu available):
  ``_record_memory_history`` while recording, ``_dump_snapshot`` at the end.

torch is imported only when recording starts (``pip install memgate[torch]``).

In pytest, the plugin's ``memgate_record`` fixture yields a started :class:`Recorder` writing into
``memgate_profile_dir``; the plugin stops it right after the test body, *before* the marker gates
that directory (fixture teardown would be too late).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import warnings
from decimal import Decimal
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, Self

TRACE_NAME = "torch_trace.json"
CUDA_SNAPSHOT = "cuda_snapshot.pickle"
NPU_SNAPSHOT = "npu_snapshot.pickle"
_FOREVER = 1 << 30  # "active" steps of the schedule: record every step until stop()


def _torch() -> ModuleType:
    try:
        return importlib.import_module("torch")
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        raise ModuleNotFoundError("memgate.record records a torch run and needs torch: pip install "
                                  "'memgate[torch]'", name="torch") from None


class Recorder:
    """Profiles a torch run into ``directory``; call :meth:`step` once per training step."""

    def __init__(self, directory: str | Path, *, warmup: int = 0, snapshots: bool = True,
                 max_entries: int = 100_000, record_shapes: bool = False) -> None:
        self.directory = Path(directory)
        self.warmup = warmup
        self.snapshots = snapshots
        self.max_entries = max_entries
        self.record_shapes = record_shapes
        self.files: list[Path] = []
        self.steps = 0
        self._profiler: Any = None
        self._memory: list[tuple[Any, Path]] = []  # (torch.cuda.memory-like module, snapshot path)
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> Self:
        if self._profiler is not None:
            return self
        torch = _torch()
        from torch.profiler import ProfilerActivity, profile, schedule

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
                with_stack=False,
                schedule=schedule(wait=0, warmup=self.warmup, active=_FOREVER, repeat=1),
                on_trace_ready=export,
            )
            self._profiler.__enter__()
        return self

    def step(self) -> None:
        """End of one training step (the profiler's ``prof.step()``)."""
        if self._profiler is None or self._stopped:
            raise RuntimeError("the recorder is not running (call start() or use it as a context manager)")
        self._profiler.step()
        self.steps += 1

    def stop(self) -> list[Path]:
        """Stop recording and write the files (idempotent); returns the files written."""
        if self._profiler is None or self._stopped:
            return list(self.files)
        self._stopped = True
        try:
            self._profiler.__exit__(None, None, None)
        finally:
            self._dump_snapshots()
        trace = self.directory / TRACE_NAME
        if trace in self.files and self.steps:
            drop_step(trace, self.steps)  # the ProfilerStep opened by the last step() call
        return list(self.files)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

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

    def _dump_snapshots(self) -> None:
        for memory, path in self._memory:
            try:
                memory._dump_snapshot(str(path))
                self.files.append(path)
            finally:
                memory._record_memory_history(enabled=None)
        self._memory = []


def drop_step(path: Path, number: int) -> None:
    """Remove the ``ProfilerStep#<number>`` spans from a Chrome trace we just exported.

    Numbers keep their exact text (µs with 3 decimals do not survive a float): the trace is parsed
    with ``Decimal`` and written back by :func:`_dump`; the file is replaced atomically.
    """
    data = json.loads(path.read_bytes(), parse_float=Decimal)
    name = f"ProfilerStep#{number}"
    events = data.get("traceEvents")
    if not isinstance(events, list):
        return
    data["traceEvents"] = [e for e in events if not (isinstance(e, dict) and e.get("ph") == "X" and e.get("name") == name)]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        _dump(data, fh)
    os.replace(tmp, path)


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
