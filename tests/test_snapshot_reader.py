"""The compiled snapshot reader against the pure-Python one: the same loaded model, the same error.

Both readers read every real sample, the snapshot cases of the bad-input corpus, hand-made hostile and
unusual pickles, and Hypothesis-generated snapshots (real ones with values changed, pickled with protocol
2 or 4); the model each gives (every table, series and metric) or the one-line error must be the same.
Where the extension is not built, these tests compare the pure-Python reader with itself (and say so).
"""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
import random
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import corpus
import numpy as np
import pytest
from helpers import SAMPLES, sample_pickle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memgate.errors import MemgateError
from memgate.loaders.snapshot import snapshot as snapshot_loader
from memgate.loaders.snapshot.snapshot_trace import ACTIONS, MEMORY_ACTIONS
from memgate.metrics import profile_metrics
from memgate.readers import limits, snapshot_columns

ROOT = Path(__file__).resolve().parent.parent
REAL = sorted(p for p in SAMPLES.rglob("*") if p.suffix in (".pickle", ".pkl"))
compiled = pytest.mark.skipif(not snapshot_columns.compiled_available(), reason="the compiled reader is not built")


@pytest.fixture(autouse=True)
def _reader_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(snapshot_columns.PURE_ENV, raising=False)


def _plain(value: Any, depth: int = 0) -> Any:
    """A comparable rendering of a loaded model: dataclasses, tables, arrays and containers, recursively."""
    if depth > 40:
        return "..."
    if isinstance(value, float):
        return "nan" if math.isnan(value) else value
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, np.ndarray):
        return [_plain(v, depth + 1) for v in value.tolist()]
    if isinstance(value, np.generic):
        return _plain(value.item(), depth + 1)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    if hasattr(value, "tolist"):
        return _plain(value.tolist(), depth + 1)
    if hasattr(value, "__slots__"):
        return {s: _plain(getattr(value, s, None), depth + 1) for s in value.__slots__}
    if hasattr(value, "__dict__"):
        return {k: _plain(v, depth + 1) for k, v in vars(value).items()}
    return repr(value)


def outcome(path: Path, *, pure: bool) -> tuple[str, Any]:
    """What a load of ``path`` gives with one reader: the model and its metrics, or the error's line."""
    old = os.environ.get(snapshot_columns.PURE_ENV)
    os.environ[snapshot_columns.PURE_ENV] = "1" if pure else "0"
    try:
        profile = snapshot_loader.load(path)
        return "ok", _plain({"profile": profile, "metrics": profile_metrics(profile)})
    except MemgateError as exc:
        return "error", str(exc)
    finally:
        if old is None:
            del os.environ[snapshot_columns.PURE_ENV]
        else:
            os.environ[snapshot_columns.PURE_ENV] = old


def used_compiled(path: Path) -> bool:
    """Did the compiled reader take the file (rather than hand it to the pure-Python one)?"""
    return snapshot_columns._compiled(path, limits.current().max_pickle_bytes, ACTIONS, MEMORY_ACTIONS) is not None


def same(path: Path) -> tuple[str, Any]:
    fast, pure = outcome(path, pure=False), outcome(path, pure=True)
    assert fast == pure
    return fast


# ---- real samples ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", REAL, ids=lambda p: str(p.relative_to(SAMPLES)))
def test_real_samples_load_the_same_through_the_compiled_reader(path: Path) -> None:
    kind, _ = same(path)
    assert kind == "ok"
    if snapshot_columns.compiled_available():
        assert used_compiled(path), "a real snapshot must not need the fallback"


@compiled
@pytest.mark.parametrize("path", [p for p in REAL if sum(map(len, sample_pickle(p).get("device_traces") or [])) > 300],
                         ids=lambda p: p.name)
def test_the_fast_path_reads_most_entries_of_real_snapshots(path: Path) -> None:
    """torch's, torch 2.11's on an H200 (a new compile_context string per entry) and torch_npu's: the
    entries the VM reads are the first of their kind and those a FRAME cuts (a cache that never filled
    once sent every entry the slow way, with identical results)."""
    entries = sum(len(t) for t in sample_pickle(path).get("device_traces") or [])
    assert _fast_count(path) >= 0.9 * entries


@compiled
def test_inspect_json_is_the_same_from_both_readers() -> None:
    """``memgate inspect --json`` over the samples' folders, byte for byte, in processes of their own."""
    outs = []
    for pure in ("0", "1"):
        env = dict(os.environ, MEMGATE_PURE_PYTHON=pure, PYTHONPATH=str(ROOT))
        run = subprocess.run([sys.executable, "-m", "memgate", "inspect", "--json", *map(str, REAL)],
                             check=False, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
        outs.append((run.returncode, run.stdout))
    assert outs[0] == outs[1]
    assert outs[0][1].count('"torch_snapshot"') >= len(REAL) - 1


def test_version_names_the_reader(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from memgate import cli

    monkeypatch.setenv(snapshot_columns.PURE_ENV, "1")
    with pytest.raises(SystemExit):
        cli.build_parser(["--version"]).parse_args(["--version"])
    assert capsys.readouterr().out.strip().endswith("(snapshot reader: pure Python ($MEMGATE_PURE_PYTHON is set))")
    monkeypatch.delenv(snapshot_columns.PURE_ENV)
    expected = "compiled" if snapshot_columns.compiled_available() else "pure Python (the compiled reader is not built)"
    assert snapshot_columns.reader_name() == expected


# ---- the bad-input corpus --------------------------------------------------------------------------

SNAPSHOT_CASES = [c for c in corpus.CASES if c.format == "torch_snapshot" and not c.isolate and c.defect is None]


@pytest.mark.parametrize("case", SNAPSHOT_CASES, ids=lambda c: c.id)
def test_corpus_cases_fail_the_same_way(case: corpus.Case, tmp_path: Path) -> None:
    expect = case.make(tmp_path)
    target = expect.file
    if not target.is_file():
        pytest.skip("the case names a folder")
    same(target)


# ---- hand-made pickles -----------------------------------------------------------------------------


def _entry(**values: Any) -> dict[str, Any]:
    return {"action": "alloc", "addr": 1024, "size": 512, "stream": 0, "time_us": 10, "frames": [], **values}


def _snapshot(entries: list[Any]) -> dict[str, Any]:
    return {"segments": [{"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0, "segment_type": "large",
                          "allocated_size": 0, "active_size": 0, "requested_size": 0,
                          "blocks": [{"size": 2 << 20, "state": "inactive", "requested_size": 0}]}],
            "device_traces": [entries]}


_FRAME = {"filename": "train.py", "line": 3, "name": "step"}
ODD_ENTRIES = {
    "negative-addr": [_entry(addr=-1)],
    "addr-past-int64": [_entry(addr=2**64)],
    "bool-size": [_entry(size=True)],
    "float-time": [_entry(time_us=1.5)],
    "time-past-the-bound": [_entry(time_us=2**62)],
    "none-stream": [_entry(stream=None)],
    "unknown-action": [_entry(action="grow")],
    "no-action": [{"addr": 1, "size": 1}],
    "alloc-without-size": [{"action": "alloc", "addr": 1}],
    "tuple-frames": [_entry(frames=(_FRAME,))],
    "none-frames": [_entry(frames=None)],
    "frames-of-ints": [_entry(frames=[1, 2])],
    "int-key": [{**_entry(), 5: "x"}],
    "extra-keys": [_entry(compile_context="ctx", forward_frames=[], user_metadata="m")],
    "bad-compile-context": [_entry(compile_context=3)],
    "lone-surrogate-action": [_entry(action="\u00e9\udc80")],
    "lone-surrogate-compile-context": [_entry(compile_context="ctx\udc80")],
    "entry-not-a-dict": [_entry(), [1, 2]],
    "some-without-time": [_entry(), {k: v for k, v in _entry(addr=2048).items() if k != "time_us"}],
    "oom": [_entry(), {"action": "oom", "device_free": 5, "time_us": 11, "frames": [_FRAME]}],
    "markers-only": [{"action": "snapshot"}, {"action": "workspace_snapshot", "time_us": 3}],
    "out-of-order": [_entry(time_us=20, frames=[_FRAME]), _entry(addr=4096, time_us=5, frames=[_FRAME, _FRAME])],
    # a malformed frame in the second distinct stack, first held by a free (whose frames no load reads)
    "bad-frame-later": [_entry(frames=[_FRAME]),
                        _entry(action="free_requested", frames=[{"filename": "m.py", "line": "3", "name": "f"}]),
                        _entry(addr=4096, frames=[_FRAME]),
                        _entry(addr=8192, frames=[{"filename": "m.py", "line": "3", "name": "f"}])],
}


@pytest.mark.parametrize("protocol", [2, 4])
@pytest.mark.parametrize("name", sorted(ODD_ENTRIES))
def test_odd_trace_entries_read_the_same(name: str, protocol: int, tmp_path: Path) -> None:
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(_snapshot(ODD_ENTRIES[name]), protocol=protocol))
    same(path)


@pytest.mark.parametrize("name", ["lone-surrogate-action", "lone-surrogate-compile-context"])
def test_a_string_no_utf_8_can_hold_is_an_error_naming_its_entry(name: str, tmp_path: Path) -> None:
    """A pickle's string may hold a lone surrogate (its bytes decoded with surrogatepass): a clean error
    naming the entry's field, not pyarrow's UnicodeEncodeError (the structural fuzz found it)."""
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(_snapshot(_many(ODD_ENTRIES[name])), protocol=4))
    kind, message = same(path)
    assert kind == "error"
    assert "device_traces[0][8]." in message and "not valid Unicode (a lone surrogate)" in message


def _shared_lists() -> dict[str, Any]:
    """Entries sharing one frames list object, and a frames list equal to another but a list of its own."""
    shared = [_FRAME, _FRAME]
    entries = [_entry(frames=shared), _entry(addr=4096, frames=shared), _entry(addr=8192, frames=list(shared)),
               _entry(action="free_requested", frames=shared),
               {k: v for k, v in _entry(action="free_completed").items() if k != "frames"}]
    return _snapshot(entries)


@compiled
def test_a_shared_frames_list_is_one_stack(tmp_path: Path) -> None:
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(_shared_lists(), protocol=4))
    assert same(path)[0] == "ok"
    data = snapshot_columns.load(path, max_bytes=1 << 30, actions=ACTIONS, moves=MEMORY_ACTIONS)
    trace = data["device_traces"][0]
    assert isinstance(trace, snapshot_columns.TraceColumns)
    assert trace.frames.sid.tolist() == [0, 0, 0, 0, -1]  # the same frame objects: one stack
    assert trace[4] == {"action": "free_completed", "addr": 1024, "size": 512, "stream": 0, "time_us": 10}
    assert trace[0]["frames"] == [_FRAME, _FRAME]


def _hand(body: bytes) -> bytes:
    """PROTO 2, ``{"segments": [], "device_traces": [[<body>]]}``: ``body`` builds the one entry."""
    def text(s: str) -> bytes:
        return b"X" + struct.pack("<I", len(s)) + s.encode()

    return (b"\x80\x02}q\x00(" + text("segments") + b"]" + text("device_traces") + b"]q\x01]q\x02" + body
            + b"a" + b"a" + b"u.")


def _text(s: str) -> bytes:
    return b"X" + struct.pack("<I", len(s)) + s.encode()


_ENTRY = b"}q\x03(" + _text("action") + _text("snapshot") + b"u"
HOSTILE = {
    "memo-bomb": b"\x80\x02}r\xff\xff\xff\x1f.",
    "binget-unset": b"\x80\x02}h\x07.",
    "binget-of-an-entry": _hand(_ENTRY + b"ah\x03"),  # the entry appended twice (the second by reference)
    "entry-mutated-after": _hand(_ENTRY + b"a" + b"h\x03" + _text("addr") + b"K\x05s"),
    "frames-appended-after": _hand(b"}q\x03(" + _text("action") + _text("snapshot") + _text("frames")
                                   + b"]q\x04u" + b"ah\x04K\x01"),
    "global": b"\x80\x02cos\nsystem\n.",
    "trailing": pickle.dumps({"segments": []}, protocol=2) + b"junk",
    "trailing-nul": pickle.dumps({"segments": []}, protocol=2) + b"\x00\x00",
    "truncated": pickle.dumps(_snapshot([_entry()]), protocol=4)[:-7],
    "two-values": b"\x80\x02}}.",
    "long-frame": b"\x80\x04\x95" + struct.pack("<Q", 1 << 40) + b"}.",
    # a FRAME length past int64 (read as a signed length it would look negative: no frame at all)
    "frame-past-int64": b"\x80\x04\x95" + struct.pack("<Q", (1 << 63) + 494) + b"}.",
    "proto-9": b"\x80\x09}.",
    "set": b"\x80\x04\x8f\x94.",
    "deep-lists": b"\x80\x02" + b"(" * 200_000 + b".",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_and_odd_pickles_fail_the_same_way(name: str, tmp_path: Path) -> None:
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(HOSTILE[name])
    same(path)


@compiled
def test_what_the_compiled_reader_hands_back(tmp_path: Path) -> None:
    """Hostile or unusual input goes to the pure-Python reader; plain snapshots do not."""
    path = tmp_path / "snapshot.pickle"
    for name in ("memo-bomb", "binget-of-an-entry", "entry-mutated-after", "frames-appended-after", "global",
                 "trailing", "deep-lists"):
        path.write_bytes(HOSTILE[name])
        assert not used_compiled(path), name
    for name in ("trailing-nul",):
        path.write_bytes(HOSTILE[name])
        assert used_compiled(path), name


# ---- Hypothesis: real snapshots with values changed ------------------------------------------------

_SEEDS = {
    "cuda": SAMPLES / "torch_cuda" / "h200_record_leak" / "cuda_snapshot.pickle",
    "torch": SAMPLES / "torch" / "snapshot_modern_small_cs336.pickle",
    "npu": SAMPLES / "torch_npu_snapshot" / "npu_snapshot_expandable.pkl",
}
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                    st.text(max_size=6), st.sampled_from(["alloc", "free_completed", "oom", "snapshot", (1, 2), b"x",
                                                          2**63, -1, [], [_FRAME]]))


def _paths(doc: Any, depth: int = 0) -> Iterator[tuple[Any, Any]]:
    """(container, key) of some values of ``doc``: the trace entries' fields first."""
    traces = doc.get("device_traces") if isinstance(doc, dict) else None
    for trace in traces or []:
        for entry in trace[:50]:
            if isinstance(entry, dict):
                for key in entry:
                    yield entry, key


@settings(max_examples=int(os.environ.get("MEMGATE_READER_EXAMPLES", "25")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_changed_snapshots_read_the_same(data: st.DataObject, tmp_path: Path) -> None:
    doc = sample_pickle(_SEEDS[data.draw(st.sampled_from(sorted(_SEEDS)), label="seed")])
    spots = list(_paths(doc))
    for _ in range(data.draw(st.integers(0, 3), label="changes")):
        parent, key = spots[data.draw(st.integers(0, len(spots) - 1), label="spot")]
        if data.draw(st.booleans(), label="delete"):
            parent.pop(key, None)
        else:
            parent[key] = data.draw(_VALUES, label="value")
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(doc, protocol=data.draw(st.sampled_from([2, 4, 5]), label="protocol")))
    same(path)


# ---- a bounded structural fuzz (.ci/run runs it for a minute under ASan and UBSan) -------------------


def _mutate(rng: random.Random, data: bytes) -> bytes:
    """One structural change of a pickle: a byte flipped, a span cut, dropped, repeated or moved, a length
    field (the 4 or 8 bytes after an opcode) made huge, a byte inserted."""
    raw = bytearray(data)
    at = rng.randrange(len(raw))
    kind = rng.randrange(6)
    if kind == 0:
        raw[at] ^= 1 << rng.randrange(8)
    elif kind == 1:
        del raw[at:at + rng.randrange(1, 64)]
    elif kind == 2:
        span = raw[at:at + rng.randrange(1, 64)]
        raw[at:at] = span
    elif kind == 3:
        raw[at:at + 4] = rng.choice([b"\xff\xff\xff\x7f", b"\x00\x00\x00\x80", b"\xff\xff\xff\xff"])
    elif kind == 4:
        raw.insert(at, rng.randrange(256))
    else:
        return bytes(raw[:at])
    return bytes(raw)


def test_structural_fuzz_for_a_while(tmp_path: Path) -> None:
    """Real snapshots with one to three structural changes: both readers give the same model or the same
    error, for ``$MEMGATE_READER_FUZZ_SECONDS`` (default 3) of generated files."""
    seconds = float(os.environ.get("MEMGATE_READER_FUZZ_SECONDS", "3"))
    rng = random.Random(int(os.environ.get("MEMGATE_READER_FUZZ_SEED", "40")))
    seeds = [p.read_bytes() for p in _SEEDS.values()] + [pickle.dumps(_shared_lists(), protocol=p) for p in (2, 4)]
    seeds.append(pickle.dumps(_varied_doc(240), protocol=4))  # the fast path's shapes, in one batch
    path = tmp_path / "snapshot.pickle"
    end, runs = time.monotonic() + seconds, 0
    while time.monotonic() < end or runs < 3:
        data = rng.choice(seeds)
        for _ in range(rng.randint(1, 3)):
            data = _mutate(rng, data) if data else data
        path.write_bytes(data or b"\x80")
        try:
            same(path)
        except AssertionError:
            (ROOT / "build").mkdir(exist_ok=True)
            (ROOT / "build" / "reader-fuzz-failure.pickle").write_bytes(data)
            raise
        runs += 1


# ---- memory: the columns go once read -------------------------------------------------------------


@compiled
def test_the_trace_columns_are_released_once_read_into_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device models are built in the memory the columns held: by the time the first one is built,
    nothing holds a trace's columns (a loop variable did once, and cost a 10M-entry load 400 MB)."""
    import weakref

    path = max(REAL, key=lambda p: p.stat().st_size)
    data = snapshot_columns.load(path, max_bytes=limits.current().max_pickle_bytes, actions=ACTIONS,
                                 moves=MEMORY_ACTIONS)
    read = [t for t in data["device_traces"] if isinstance(t, snapshot_columns.TraceColumns)]
    assert read, "the sample's traces are read as columns"
    refs = [weakref.ref(t) for t in read]
    del read
    held: list[bool] = []
    build = snapshot_loader.device_model

    def device_model(*args: Any, **kwargs: Any) -> Any:
        held.append(any(ref() is not None for ref in refs))
        return build(*args, **kwargs)

    monkeypatch.setattr(snapshot_loader, "device_model", device_model)
    assert snapshot_loader.build_profile(path, data).devices
    assert held and not any(held)


# ---- the fast path: trace entries read straight into the columns -----------------------------------


def _fast_count(path: Path) -> int:
    """How many entries the compiled reader's fast path read (Unsupported: raised)."""
    from memgate.readers import _snapshot_core  # type: ignore[attr-defined]

    stats: dict[str, int] = {}
    with open(path, "rb") as fh:
        _snapshot_core.read(fh, path.stat().st_size, 1 << 30, ACTIONS, MEMORY_ACTIONS, stats)
    return stats["fast"]


def _many(odd: list[Any], copies: int = 2) -> list[Any]:
    """Plain entries sharing frame objects (the keys, actions and frames memoized), then ``odd`` entries
    ``copies`` times (the later copies reach the fast path with their keys and values memoized)."""
    frames = [_FRAME, {"filename": "model.py", "line": 7, "name": "forward"}]
    plain = [_entry(addr=1024 * (k + 1), time_us=k, frames=[frames[k % 2], frames[0]][: k % 3])
             for k in range(6)]
    plain.append(_entry(action="free_requested", frames=[frames[1]]))
    plain.append(_entry(action="free_completed", frames=[frames[1]]))
    return plain + [dict(e) if isinstance(e, dict) else e for _ in range(copies) for e in odd]


@pytest.mark.parametrize("name", sorted(ODD_ENTRIES))
def test_odd_entries_among_plain_ones_read_the_same(name: str, tmp_path: Path) -> None:
    """Each odd entry after plain ones, twice, in one APPENDS batch: the fast path meets it with its
    keys known and must leave to the generic way (or read) exactly what the reference reads."""
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(_snapshot(_many(ODD_ENTRIES[name])), protocol=4))
    same(path)


def _fresh(text: str) -> str:
    """An equal string that is a new object (as torch makes one for each entry): pickled in place each time."""
    return "".join(list(text))


def _varied(n: int) -> list[dict[str, Any]]:
    """``n`` entries of the shapes writers use: no frames, one, many (past the fast path's 512), a shared
    frames list, empty frames followed by more keys, compile_context and user_metadata (strings written
    in place each time, one not valid UTF-8 but for surrogatepass), None values,
    unknown keys, device_free on an OOM, markers; values of every integer opcode's width."""
    rng = random.Random(7)
    frames = [{"filename": f"f{k}.py", "line": k, "name": f"fn{k}"} for k in range(40)]
    shared = [frames[1], frames[2]]
    out: list[dict[str, Any]] = []
    for k in range(n):
        shape = k % 9
        if k % 3 == 0:  # each block allocated, then freed (a free requested, then completed)
            addr, size = rng.choice([200, 60_000, 2**31 - 1, 2**40 + k, 2**62]), rng.choice([1, 512, 70_000, 2**33])
        action = ("alloc", "free_requested", "free_completed")[k % 3]
        entry: dict[str, Any] = {"action": action, "addr": addr, "size": size, "stream": rng.choice([0, 7, -1]),
                                 "time_us": k * 1000}
        if shape == 0:  # torch makes a new "N/A" string for each entry: written in place every time
            entry.update(frames=[], compile_context=_fresh("N/A"), user_metadata="")
        elif shape == 1:
            entry["frames"] = [frames[k % 40]]
        elif shape == 2:
            entry["frames"] = [frames[j % 40] for j in range(k % 30)]
        elif shape == 3:
            entry["frames"] = shared
        elif shape == 4:
            entry["frames"] = [frames[j % 40] for j in range(600)]  # past the fast path's frame count
        elif shape == 5:
            entry.update(frames=[frames[3]], compile_context=_fresh("N/A"), user_metadata=None,
                         custom=_fresh("tag"), other=_fresh("é\udc80"))
        elif shape == 6:
            out.append({"action": "oom", "device_free": rng.choice([0, 5, 2**35]), "time_us": k * 1000 - 1,
                        "frames": shared})
        elif shape == 7:
            out.append({"action": "snapshot", "time_us": k * 1000 - 1})
        else:
            entry.update(frames=[frames[5], frames[6]], forward_frames=[])
        out.append(entry)
    return out


def _varied_doc(n: int) -> dict[str, Any]:
    """A snapshot of :func:`_varied` entries in one 16 GiB segment."""
    doc = _snapshot(_varied(n))
    doc["segments"][0].update(total_size=2**34, blocks=[{"size": 2**34, "state": "inactive", "requested_size": 0}])
    return doc


@compiled
def test_a_long_varied_trace_reads_the_same_and_mostly_fast(tmp_path: Path) -> None:
    """3000 entries of varied shapes over many 64 KiB FRAMEs (entries cut by a FRAME go the generic way):
    the same model, and the fast path reads most of them."""
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(_varied_doc(3000), protocol=4))
    assert same(path)[0] == "ok"
    assert used_compiled(path)
    assert _fast_count(path) > 2000


@compiled
def test_the_columns_hold_their_entries_and_nothing_more(tmp_path: Path) -> None:
    """Grown in place past many doublings, then cut to the entries read: each column owns its memory and
    has no spare room (a column that kept its growth's slack, or a view into it, would hold up to 2x)."""
    path = tmp_path / "snapshot.pickle"
    doc = _varied_doc(3000)
    n = len(doc["device_traces"][0])
    path.write_bytes(pickle.dumps(doc, protocol=4))
    trace = snapshot_columns.load(path, max_bytes=1 << 30, actions=ACTIONS, moves=MEMORY_ACTIONS)["device_traces"][0]
    assert isinstance(trace, snapshot_columns.TraceColumns)
    for name in ("code", "addr", "size", "stream", "time_us", "device_free", "has", "xid"):
        column = getattr(trace, name)
        assert (len(column), column.base, column.flags.owndata) == (n, None, True), name
    assert (len(trace.frames.sid), trace.frames.sid.base) == (n, None)
    assert trace[n - 1] == trace[-1] and trace[0]["action"] == doc["device_traces"][0][0]["action"]


def test_stack_refs_read_as_the_lists_they_stand_for() -> None:
    """The compiled reader's frames per entry: a stack looked up when asked, as a list of them reads."""
    a, b = [_FRAME], [_FRAME, {"filename": "model.py", "line": 7, "name": "forward"}]
    refs = snapshot_columns.StackRefs([a, b], np.array([1, -1, 0, 1], dtype=np.int32))
    assert len(refs) == 4 and list(refs) == [b, None, a, b]
    assert refs[0] is b and refs[1] is None and refs[np.int64(2)] is a and refs[-1] is b
    assert refs[1:3] == [None, a] and refs[::-2] == [b, None]
    with pytest.raises(IndexError):
        refs[4]


class _Asm:
    """A protocol-4 pickle written opcode by opcode (memo slots by MEMOIZE), for shapes no pickler writes."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x04")
        self.slots = 0
        self.named: dict[str, int] = {}
        self.frame = -1

    def memoize(self) -> int:
        self.out += b"\x94"
        self.slots += 1
        return self.slots - 1

    def get(self, slot: int) -> None:
        self.out += b"j" + struct.pack("<I", slot)

    def text(self, s: str, *, fresh: bool = False) -> None:
        if s in self.named and not fresh:
            self.get(self.named[s])
            return
        self.out += b"\x8c" + bytes([len(s)]) + s.encode()
        self.named[s] = self.memoize()

    def entry(self, addr: int, *, frames: Sequence[int] = (), dup: bool = False, fresh_key: bool = False,
              new_frame: bool = False) -> int:
        """An entry (its memo slot); ``new_frame``: its frames list starts with a frame dict written in
        place (its slot in ``self.frame``), as a pickler writes a frame's first use."""
        self.out += b"}"
        slot = self.memoize()
        self.out += b"("
        for key, value in (("action", "alloc"), ("addr", addr), ("size", 512), ("stream", 0)):
            self.text(key, fresh=fresh_key and key == "addr")
            if isinstance(value, str):
                self.text(value)
            else:
                self.out += b"J" + struct.pack("<i", value)
        if dup:
            self.text("size")
            self.out += b"J" + struct.pack("<i", 1024)
        self.text("frames")
        self.out += b"]"
        self.memoize()
        self.out += b"("
        if new_frame:
            self.out += b"}"
            self.frame = self.memoize()
            self.out += b"("
            for key, value in (("filename", "x.py"), ("name", "f")):
                self.text(key)
                self.text(value)
            self.out += b"u"
        for f in frames:
            self.get(f)
        self.out += b"eu"
        return slot

    def snapshot(self, body: Any) -> bytes:
        """``{"segments": [], "device_traces": [trace]}``, ``body(self)`` writing the trace's items after
        its MARK and closing them (APPENDS or whatever it tests)."""
        self.out += b"}"
        self.memoize()
        self.out += b"("
        self.text("segments")
        self.out += b"]"
        self.memoize()
        self.text("device_traces")
        self.out += b"]"
        self.memoize()
        self.out += b"]"
        self.memoize()
        self.out += b"("
        body(self)
        self.out += b"au."
        return bytes(self.out)


def _frame(a: _Asm) -> int:
    """A first entry, whose frames list writes the frame the others refer to: that frame's slot."""
    a.entry(1 << 20, new_frame=True)
    return a.frame


def _asm_cases() -> dict[str, tuple[bytes, bool]]:
    """name -> (pickle, may the compiled reader take it)."""
    def plain(a: _Asm) -> None:
        f = _frame(a)
        for k in range(5):
            a.entry(4096 * (k + 1), frames=[f, f])
        a.out += b"e"

    def closed_by_tuple(a: _Asm) -> None:  # entries read into the trace, then the batch is no APPENDS
        f = _frame(a)
        for k in range(5):
            a.entry(4096 * (k + 1), frames=[f])
        a.out += b"te"

    def duplicate_key(a: _Asm) -> None:
        f = _frame(a)
        for k in range(4):
            a.entry(4096 * (k + 1), frames=[f], dup=k == 3)
        a.out += b"e"

    def refers_to_a_spent_entry(a: _Asm) -> None:
        f = _frame(a)
        spent = [a.entry(4096 * (k + 1), frames=[f]) for k in range(3)]
        a.entry(65536, frames=[f, spent[0]])
        a.out += b"e"

    def refers_to_itself(a: _Asm) -> None:
        f = _frame(a)
        for k in range(3):
            a.entry(4096 * (k + 1), frames=[f])
        a.entry(65536, frames=[f, a.slots])  # its own slot (the entry's MEMOIZE comes first)
        a.out += b"e"

    def another_addr_key(a: _Asm) -> None:  # a second "addr" string object: equal, not the same
        f = _frame(a)
        for k in range(4):
            a.entry(4096 * (k + 1), frames=[f], fresh_key=k == 2)
        a.out += b"e"

    return {name: (_Asm().snapshot(body), ok) for name, body, ok in (
        ("plain", plain, True), ("closed-by-tuple", closed_by_tuple, False), ("duplicate-key", duplicate_key, True),
        ("refers-to-a-spent-entry", refers_to_a_spent_entry, False), ("refers-to-itself", refers_to_itself, False),
        ("another-addr-key", another_addr_key, True))}


ASM = _asm_cases()


@pytest.mark.parametrize("name", sorted(ASM))
def test_hand_written_batches_read_the_same(name: str, tmp_path: Path) -> None:
    path = tmp_path / "snapshot.pickle"
    data, ok = ASM[name]
    path.write_bytes(data)
    pickle.loads(data) if ok else None  # the hand-written pickles are well-formed where they should be
    same(path)
    if snapshot_columns.compiled_available():
        assert used_compiled(path) == ok, name
        if ok:
            assert _fast_count(path) >= 3, name
