"""Record a real torch run into a directory memgate reads: a Kineto trace, and snapshots where a GPU is.

    from memgate.record import record

    with record("prof_dir") as rec:
        for batch in loader:
            train_step(batch)
            rec.step()  # once per training step: ProfilerStep#N boundaries

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
import re
import sys
import sysconfig
import warnings
from decimal import Decimal
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, Self

from memgate.readers.jsonstream import escape_names

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
                 max_entries: int = 100_000, record_shapes: bool = False, with_stack: bool = True,
                 with_modules: bool = True) -> None:
        self.directory = Path(directory)
        self.warmup = warmup
        self.snapshots = snapshots
        self.max_entries = max_entries
        self.record_shapes = record_shapes
        self.with_stack = with_stack
        self.with_modules = with_modules
        self.files: list[Path] = []
        self.steps = 0
        self.memory_events: int | None = None  # [memory] events in the trace, once stopped
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
                with_stack=self.with_stack,
                with_modules=self.with_modules,
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
        if trace in self.files:
            # the ProfilerStep opened by the last step() call (by the start, without any)
            self.memory_events = drop_step(trace, self.steps)
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

_FRAME = re.compile(r"\A(?P<file>.+)\((?P<line>[0-9]+)\): (?P<function>.+)\Z")
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


def user_frame(name: str, library: tuple[str, ...]) -> tuple[str, int, str] | None:
    """(file, line, function) of a ``python_function`` event name like ``model.py(12): forward``, when
    the file is the user's code (not the standard library, an installed package, torch or memgate)."""
    match = _FRAME.match(name)
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


def _shown_path(file: str) -> str:
    try:
        return str(_resolve(file).relative_to(Path.cwd().resolve()))
    except ValueError:
        return file


def _ns(ts: Any, base: int) -> int:
    return int((Decimal(ts) * 1000).to_integral_value()) + base


def allocation_stacks(trace: Path, holders: list[dict[str, Any]]) -> list[list[str]]:
    """For each holder (``{"size", "t_alloc", ...}`` of ``top_at_peak``), the user functions that were
    running when it was allocated, innermost first (``forward (model.py:30)``; the line is where the
    function starts). Empty where the trace has no Python frames (recorded without ``with_stack``),
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
    library = _library_dirs()
    spans: dict[tuple[Any, Any], list[tuple[int, int, str]]] = {}
    for e in events:
        if e.get("cat") == "python_function" and e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in allocs.values():
            frame = user_frame(str(e.get("name", "")), library)
            if frame is not None:
                start = _ns(e["ts"], base)
                text = f"{frame[2]} ({_shown_path(frame[0])}:{frame[1]})"
                spans.setdefault((e.get("pid"), e.get("tid")), []).append((start, start + _ns(e.get("dur", 0), 0), text))
    stacks: list[list[str]] = []
    for h in holders:
        thread = allocs.get((h.get("t_alloc"), h.get("size")))  # type: ignore[arg-type]
        t = h.get("t_alloc")
        if thread is None or t is None:
            stacks.append([])
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
            # a raw frame owner (``file.py(7): make``) reads better as the stack shows it; a module path stays
            owner = entry.get("owner")
            entry["owner"] = stack[0] if not owner or _FRAME.match(str(owner)) else owner
        out.append(entry)
    return out
