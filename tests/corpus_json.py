"""Issue 11's JSON-side corpus: each class of input the boundary now reads or refuses, one case or more.

Built from the real samples (``tests/data/samples``) or the test writers at test time, like
``tests/corpus.py``, whose :class:`Case` / :class:`Expect` they use; ``tests/test_corpus.py`` runs
them in their own block (loader API, CLI, pytest). Classes: a key repeated with another value (a
Kineto event, its args, the top-level object, a second traceEvents, a trace_view counter,
profiler_info), a gzip stream past the cap on inflated bytes, [memory] events with Addr on some
only, the raw export_memory_timeline (malformed rows, rows that contradict each other, a cut gzip),
and a found value repr() cannot write (a 5000-digit int in a snapshot).
"""

from __future__ import annotations

import gzip
import json
import pickle
import re
from collections.abc import Callable
from pathlib import Path

from corpus import Case, Expect, _mkdir, sample_dir, small_trace
from helpers import PTA21_L0, PTA271, SAMPLES
from writers.kineto import raw_timeline_rows, write_raw_timeline

KINETO_SAMPLE = SAMPLES / "torch" / "cpu_train_profile_memory.json"
JSON_CASES: list[Case] = []


def case(id: str, fmt: str, *, pytest_sample: bool = False) -> Callable[[Callable[[Path], Expect]], Callable[[Path], Expect]]:
    def register(make: Callable[[Path], Expect]) -> Callable[[Path], Expect]:
        JSON_CASES.append(Case(id, fmt, make, pytest_sample=pytest_sample))
        return make
    return register


def _kineto(tmp: Path, edit: Callable[[bytes], bytes], name: str = "train.pt.trace.json") -> Path:
    path = _mkdir(tmp / "kineto") / name
    path.write_bytes(edit(KINETO_SAMPLE.read_bytes()))
    return path


def _insert(data: bytes, anchor: bytes, text: bytes) -> bytes:
    at = data.index(anchor)
    return data[:at] + text + data[at:]


def _first_memory_event(data: bytes) -> int:
    return next(i for i, e in enumerate(json.loads(data)["traceEvents"]) if e.get("name") == "[memory]")


# ---- keys repeated with another value --------------------------------------------------------------

@case("kineto-args-key-repeated-with-another-value", "kineto", pytest_sample=True)
def kineto_repeated_bytes(tmp: Path) -> Expect:
    path = _kineto(tmp, lambda d: _insert(d, b'"Bytes": 16384', b'"Bytes": 1, '))
    where = f"traceEvents[{_first_memory_event(path.read_bytes())}].args.Bytes"
    return Expect(path, path, None, where, ("conflicting duplicate key 'Bytes'", "1, then 16384"))


@case("kineto-event-ts-repeated-with-another-value", "kineto")
def kineto_repeated_ts(tmp: Path) -> Expect:
    path = _kineto(tmp, lambda d: _insert(d, b'"ts": 4448489590991.992', b'"ts": 4448489590000.000, '))
    where = f"traceEvents[{_first_memory_event(path.read_bytes())}].ts"
    return Expect(path, path, None, where, ("conflicting duplicate key 'ts'",))


@case("kineto-top-level-base-time-repeated", "kineto")
def kineto_repeated_base(tmp: Path) -> Expect:
    path = _kineto(tmp, lambda d: _insert(d, b'"baseTimeNanoseconds"', b'"baseTimeNanoseconds": 0, '))
    return Expect(path, path, None, "baseTimeNanoseconds", ("conflicting duplicate key 'baseTimeNanoseconds'",))


@case("kineto-top-level-key-repeated-after-the-events", "kineto")
def kineto_repeated_tail(tmp: Path) -> Expect:
    path = _kineto(tmp, lambda d: _insert(d, b'"traceEvents"', b'"traceName": "a.json", '))
    return Expect(path, path, None, "traceName", ("conflicting duplicate key 'traceName'",))


@case("kineto-second-trace-events-array", "kineto")
def kineto_second_events(tmp: Path) -> Expect:
    path = _kineto(tmp, lambda d: d.rstrip()[:-1] + b', "traceEvents": [{"ph": "X"}]}')
    return Expect(path, path, None, "traceEvents", ("conflicting duplicate key 'traceEvents'",))


@case("kineto-distributed-rank-repeated", "kineto")
def kineto_repeated_rank(tmp: Path) -> Expect:
    path = _kineto(tmp, lambda d: _insert(d, b'"traceEvents"', b'"distributedInfo": {"rank": 0, "rank": 1}, '))
    return Expect(path, path, None, "distributedInfo.rank", ("conflicting duplicate key 'rank'",))


@case("trace-view-counter-key-repeated", "torch_npu")
def trace_view_repeated_kb(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L0, tmp)
    path = root / "trace_view.json"
    data = path.read_bytes()
    first = data.index(b'"KB": ')
    path.write_bytes(data[:first] + b'"KB": 1.0, ' + data[first:])
    index = next(i for i, e in enumerate(json.loads(data)) if "KB" in (e.get("args") or {}))
    return Expect(root, path, None, f"[{index}].args.KB", ("conflicting duplicate key 'KB'",))


@case("profiler-info-rank-repeated", "torch_npu")
def profiler_info_repeated_rank(tmp: Path) -> Expect:
    root = sample_dir(PTA271, tmp)
    path = root / "profiler_info_0.json"
    path.write_bytes(_insert(path.read_bytes(), b'"rank_id"', b'"rank_id": 7, '))
    return Expect(root, path, None, "rank_id", ("conflicting duplicate key 'rank_id'",))


# ---- inflated bytes, Addr on some events only --------------------------------------------------------

@case("kineto-gzip-bomb", "kineto", pytest_sample=True)
def kineto_gzip_bomb(tmp: Path) -> Expect:
    """100 MiB of spaces from ~100 KB (concatenated gzip members): the default cap stops it at 16 MiB."""
    path = _mkdir(tmp / "kineto") / "bomb.pt.trace.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": [') + gzip.compress(b" " * (1 << 20), 9) * 100)
    return Expect(path, path, None, None, ("inflates past", "MEMGATE_MAX_INFLATED_BYTES"))


@case("kineto-addr-on-some-memory-events-only", "kineto")
def kineto_some_addr(tmp: Path) -> Expect:
    def drop_first(data: bytes) -> bytes:
        return re.sub(rb', "Addr": \d+', b"", data, count=1)
    path = _kineto(tmp, drop_first)
    where = f"traceEvents[{_first_memory_event(path.read_bytes())}].args.Addr"
    return Expect(path, path, None, where, ("among [memory] events with one",))


# ---- the raw export_memory_timeline ----------------------------------------------------------------------

def _raw(tmp: Path, edit: Callable[[list[list[int]]], object], *, gz: bool = True) -> Path:
    rows = raw_timeline_rows(small_trace(ge=False))
    edit(rows)
    path = _mkdir(tmp / "timeline") / ("run.raw.json.gz" if gz else "run.raw.json")
    text = json.dumps(rows).encode()
    path.write_bytes(gzip.compress(text) if gz else text)
    return path


@case("raw-timeline-row-of-three", "torch_memory_timeline_raw", pytest_sample=True)
def raw_row_of_three(tmp: Path) -> Expect:
    path = _raw(tmp, lambda rows: rows[2].pop())
    return Expect(path, path, None, "[2]", ("[t, action, bytes, category]",))


@case("raw-timeline-unknown-action", "torch_memory_timeline_raw")
def raw_unknown_action(tmp: Path) -> Expect:
    path = _raw(tmp, lambda rows: rows[1].__setitem__(1, 9), gz=False)
    return Expect(path, path, None, "[1][1]", ("value not allowed",))


@case("raw-timeline-free-of-nothing", "torch_memory_timeline_raw")
def raw_free_of_nothing(tmp: Path) -> Expect:
    path = _raw(tmp, lambda rows: rows.insert(1, [rows[1][0], 4, -(1 << 40), 0]))
    return Expect(path, path, None, "[1][2]", ("memory below zero",))


@case("raw-timeline-half-an-increment", "torch_memory_timeline_raw")
def raw_half_increment(tmp: Path) -> Expect:
    path = _raw(tmp, lambda rows: rows.insert(2, [rows[2][0], 3, -64, 0]))
    return Expect(path, path, None, "[2][2]", ("INCREMENT_VERSION row without its pair",))


@case("raw-timeline-gz-cut-mid-stream", "torch_memory_timeline_raw")
def raw_gz_cut(tmp: Path) -> Expect:
    path = _raw(tmp, lambda rows: rows.extend([[r[0] + 1, 2, 64, 0] for r in rows[-1:] * 2000]))
    path.write_bytes(path.read_bytes()[:-40])
    return Expect(path, path, None, None, ())


@case("raw-timeline-bytes-past-int64", "torch_memory_timeline_raw")
def raw_bytes_past_int64(tmp: Path) -> Expect:
    path = _raw(tmp, lambda rows: rows[0].__setitem__(2, 1 << 64), gz=False)
    return Expect(path, path, None, "[0][2]", ("wrong type",))


# ---- a value repr() cannot write -----------------------------------------------------------------------------

@case("pickle-size-with-5000-digits", "torch_snapshot")
def snapshot_huge_int(tmp: Path) -> Expect:
    path = _mkdir(tmp / "snap") / "snapshot.pickle"
    path.write_bytes(pickle.dumps({"segments": [{"device": 0, "address": 1, "total_size": 10**5000,
                                                 "allocated_size": 0, "active_size": 0, "stream": 0,
                                                 "segment_type": "large", "blocks": []}],
                                   "device_traces": [[]]}, protocol=4))
    return Expect(path, path, None, "segments[0].total_size", ("<16610-bit integer>",))


def raw_timeline_file(tmp: Path) -> Path:
    """A valid raw timeline (the fuzz seed of its format)."""
    return write_raw_timeline(small_trace(ge=False), _mkdir(tmp / "timeline"))
