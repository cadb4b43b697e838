"""What a snapshot's stacks tell: the op and the owner of each allocation, and whether torch_npu wrote it.

``op`` is the innermost ``at::_ops::<name>`` C++ frame (``aten::<name>``, overload suffix kept),
``owner`` the innermost Python frame in user code (``function (file:line)``,
:func:`memgate.owners.frame_owner`; torch's own files are skipped), else the autograd node running
(``MmBackward0``, ``AccumulateGrad``: a backward pass on the GPU allocates on autograd's own thread,
whose stack has no Python frame), else the innermost frame that is no allocator or interpreter
internal. Each distinct stack is read once (:func:`op_owner_each`, over
:mod:`memgate.loaders.snapshot.stack_groups`), and each frame dict once however many stacks share it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from memgate.errors import InputError
from memgate.loaders.events import is_torch_file
from memgate.loaders.snapshot.snapshot_segments import Segments
from memgate.loaders.snapshot.snapshot_trace import Trace
from memgate.loaders.snapshot.stack_groups import first_equal, first_equal_of_stacks, first_of_label
from memgate.owners import frame_owner
from memgate.readers.snapshot_columns import StackRefs, TraceColumns
from memgate.table import Texts

_OP_FRAME = re.compile(r"at::_ops::([A-Za-z0-9_]+)::(?:call|redispatch)\b")
# torch::autograd::generated::MmBackward0::apply(...), torch::autograd::AccumulateGrad::apply(...)
_NODE_FRAME = re.compile(r"\btorch::autograd::(?:generated::)?([A-Za-z0-9_]+)::apply\(")
_INTERNAL = ("unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp", "CachingAllocator", "_start",
             "__libc_start_main", "PyEval_", "PyObject_", "PyFunction_")

# What one frame tells: the op it names, the owner it is (a .py frame), the autograd node it runs, the
# fallback owner it can be.
_Role = tuple[str | None, str | None, str | None, str | None]


def op_owner(frames: Any, path: Path | None, where: str,
             roles: dict[int, _Role] | None = None) -> tuple[str | None, str | None]:
    """The innermost ATen op (``at::_ops::X::call`` → ``aten::X``) and the innermost Python frame.

    ``roles``: what each frame dict already read told, by identity (the frames of the stacks read
    in one call of :func:`op_owner_each` stay alive through it).
    """
    if not isinstance(frames, (list, tuple)):
        raise InputError("frames must be a list", file=path, column=where, expected="an array",
                         found=type(frames).__name__)
    op: str | None = None
    owner: str | None = None
    node: str | None = None
    fallback: str | None = None
    for i, frame in enumerate(frames):
        role = roles.get(id(frame)) if roles is not None else None
        if role is None:
            role = _role(frame, path, f"{where}[{i}]")
            if roles is not None:
                roles[id(frame)] = role
        op = op if op is not None else role[0]
        owner = owner if owner is not None else role[1]
        node = node if node is not None else role[2]
        fallback = fallback if fallback is not None else role[3]
        if op is not None and owner is not None:
            break
    return op, owner or node or fallback


def _role(frame: Any, path: Path | None, where: str) -> _Role:
    if not isinstance(frame, dict) or not isinstance(frame.get("name"), str) \
            or not isinstance(frame.get("filename"), str) or type(frame.get("line")) is not int:
        raise InputError("malformed stack frame", file=path, column=where,
                         expected="an object with filename, line and name", found=frame)  # errors.show: bounded
    name, filename = frame["name"], frame["filename"]
    op = f"aten::{m.group(1)}" if (m := _OP_FRAME.search(name)) else None
    # the innermost frame in user code: torch's own Python files (under a torch/torch_npu package) are skipped
    owner = frame_owner(filename, frame["line"], name) if filename.endswith(".py") and not is_torch_file(filename) \
        else None
    node = m.group(1) if (m := _NODE_FRAME.search(name)) else None
    fallback = None
    if filename not in ("??", "") and not any(s in name for s in _INTERNAL):
        fallback = frame_owner(filename, frame["line"], name) if filename != "none" else name
    return op, owner, node, fallback


def op_owner_each(frames: Sequence[Any], path: Path | None, where: Callable[[int], str]) -> tuple[Texts, Texts]:
    """:func:`op_owner` of each frames list (None: no frames), each distinct stack read once.

    torch gives every trace entry a list of its own but shares the frame dicts among them (a real
    snapshot: ~8k lists, ~170 distinct stacks; the benchmark's 1M entries: 335k allocations over 187
    stacks): :func:`~memgate.loaders.snapshot.stack_groups.first_equal` groups the lists by content in C.
    """
    return _op_owner_of_groups(frames.__getitem__, first_equal(frames), path, where)


def _op_owner_of_groups(frames_of: Callable[[int], Any], first: np.ndarray, path: Path | None,
                        where: Callable[[int], str]) -> tuple[Texts, Texts]:
    """(op, owner) per list, given ``first``, each list's group (the first list equal to it). The stacks
    are read in order of first use, so a bad one is reported where it first occurs, and each frame dict
    once (``roles``), however many stacks share it."""
    reps = np.flatnonzero(first == np.arange(len(first)))  # each stack's first list, in order of first use
    number = np.zeros(len(first), dtype=np.int64)
    number[reps] = np.arange(len(reps))
    roles: dict[int, _Role] = {}
    pairs = []
    for j in reps.tolist():
        frames = frames_of(j)
        pairs.append((None, None) if frames is None else op_owner(frames, path, where(j), roles))
    stack = number[first]
    ops, owners = Texts.of(p[0] for p in pairs), Texts.of(p[1] for p in pairs)
    return Texts(ops.codes[stack], ops.names), Texts(owners.codes[stack], owners.names)


def trace_op_owner(path: Path, trace: Trace, at: np.ndarray) -> tuple[Texts, Texts]:
    """(op, owner) of the trace entries at sorted positions ``at``, from their frames, with the trace's
    grouping of all its frames lists where the torch_npu scan made it (:attr:`Trace.first_equal`)."""
    rows = trace.file_rows(at)

    def where(j: int) -> str:
        return f"device_traces[{trace.device}][{int(rows[j])}].frames"

    frames = trace.frames
    if trace.grouped:
        first = first_of_label(trace.first_equal[rows])
    elif isinstance(frames, StackRefs):  # the compiled reader's: grouped over the distinct stacks of these rows
        first = first_equal_of_stacks(frames.stacks, frames.sid[rows])
    else:  # grouped on their own
        return op_owner_each(list(map(frames.__getitem__, rows.tolist())), path, where)
    return _op_owner_of_groups(lambda j: frames[int(rows[j])], first, path, where)


def segment_op_owner(path: Path, segs: Segments, rows: np.ndarray) -> tuple[Texts, Texts]:
    """(op, owner) of the final segments' blocks at ``rows``, from their frames."""
    picked = rows.tolist()
    return op_owner_each([segs.frames[i] for i in picked], path, lambda j: f"{segs.where[picked[j]]}.frames")


# ---- torch_npu ------------------------------------------------------------------------------------

_SCAN_ENTRIES = 1000  # per trace: workspace entries are inserted at the front
_SCAN_FRAMES = 20_000  # distinct file names looked at most
_SCAN_VISITS = 2_000_000  # frame dicts read at most (a fraction of a second), shared ones counted once
# A path component exactly ``torch_npu`` followed by a separator (POSIX or Windows): a file inside the
# package (…/site-packages/torch_npu/npu/memory.py) or its sources (…/torch_npu/csrc/…), not a
# user's ``torch_npu_helper/`` nor a ``torch_npu.py`` script.
_NPU_PATH = re.compile(r"(?:^|[/\\])torch_npu[/\\]")
# The allocator conf torch's own CUDA (ROCm) allocator names in the settings it writes: it settles CUDA.
_OTHER_CONFS = frozenset({"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"})
# torch_npu's conf, by its name only (a key merely holding "NPU" is no sign of torch_npu).
_NPU_CONF = "PYTORCH_NPU_ALLOC_CONF"


def is_npu(snapshot: dict[str, Any], parsed: Sequence[Trace], *, padded: bool = False) -> bool:
    """Whether torch_npu wrote the snapshot (the same format as torch's, labelled ``npu:N``).

    A conf named for CUDA (or HIP) in ``allocator_settings`` settles it as CUDA, whatever else the file
    holds (an NPU conf beside it, workspace entries, padded blocks, torch_npu frames): torch writes it,
    and no torch_npu release (2.0.1 to 2.12) writes ``allocator_settings`` at all. Else its signs: an
    allocator conf named PYTORCH_NPU_ALLOC_CONF, workspace entries (in the first entries of a trace),
    final blocks sized as torch_npu rounds a request (``padded``: 32 B added first; see
    :func:`~memgate.loaders.snapshot.block_sizes.pad_shown`), or a stack frame from a file inside a ``torch_npu``
    directory (its Python package, its C++ sources). ``parsed``: the device traces.
    """
    settings = snapshot.get("allocator_settings")
    confs = set(settings) if isinstance(settings, dict) else set()
    if confs & _OTHER_CONFS:
        return False
    if _NPU_CONF in confs:
        return True
    traces = [t for t in snapshot.get("device_traces") or [] if isinstance(t, (list, tuple, TraceColumns))]
    heads = [[e for e in t[:_SCAN_ENTRIES] if isinstance(e, dict)] for t in traces]
    if any(e.get("action") == "workspace_snapshot" for head in heads for e in head):
        return True
    if padded:
        return True
    # The frames: the segments' first, then every entry of every trace, until _SCAN_VISITS frames were
    # read (a torch_npu frame may first show past the first thousand entries, or deep in the segments).
    # That walk reads each list's every frame (20M for the benchmark's 1M entries, ~1.5 s), so it is
    # taken only where a torch_npu frame is somewhere at all: in the segments' frames or in a distinct
    # stack of a trace (a list equal to a stack holds frames with its file names; stack_groups).
    distinct = (p.frames[j] for p in parsed for j in np.flatnonzero(p.first_equal == np.arange(len(p.frames))).tolist())
    if not _has_npu_frames(chain(_segment_frames(snapshot.get("segments")), distinct), bounded=False):
        return False
    return _has_npu_frames(chain(
        _segment_frames(snapshot.get("segments")),
        (e.get("frames") for t in traces for e in t if isinstance(e, dict))))


def _segment_frames(segments: Any) -> Any:
    """The frames lists of the segments and their blocks (a legacy block's in its history), lazily."""
    for seg in segments if isinstance(segments, (list, tuple)) else ():
        if not isinstance(seg, dict):
            continue
        yield seg.get("frames")
        for block in seg.get("blocks") or ():
            if isinstance(block, dict):
                yield block.get("frames")
                history = block.get("history")
                if isinstance(history, (list, tuple)) and history and isinstance(history[0], dict):
                    yield history[0].get("frames")


def _has_npu_frames(stacks: Iterable[Any], *, bounded: bool = True) -> bool:
    """Whether a frame of ``stacks`` (frames lists, None where absent) lies in a torch_npu directory.

    Frames lists and frame dicts are read once each by identity: torch shares the dicts among
    entries, so a thousand entries hold a few hundred distinct frames. ``bounded``: False when every
    frame must be read, whatever the _SCAN_FRAMES and _SCAN_VISITS limits.
    """
    seen_lists: set[int] = set()
    seen: set[int] = set()
    names: set[str] = set()  # frames not shared by identity (a re-pickled file) still share their file names
    for frames in stacks:
        if not isinstance(frames, (list, tuple)) or id(frames) in seen_lists:
            continue
        seen_lists.add(id(frames))
        for frame in frames:
            if id(frame) in seen:
                continue
            seen.add(id(frame))
            filename = frame.get("filename") if isinstance(frame, dict) else None
            if isinstance(filename, str) and filename not in names:
                names.add(filename)
                if "torch_npu" in filename and _NPU_PATH.search(filename):
                    return True
            if bounded and (len(names) >= _SCAN_FRAMES or len(seen) >= _SCAN_VISITS):
                return False
    return False
