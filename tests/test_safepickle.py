"""memgate.readers.safepickle: the object cap (pickle bombs), and the metered input it reads through.

The class-refusing side (REDUCE, EXT*, persistent ids) and the size cap are tested with the
snapshot loader in test_snapshot.py; peak RSS on the list bomb in test_corpus.py.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from memgate.errors import ConfigError, InputError
from memgate.readers import limits, safepickle

TORCH = Path(__file__).parent / "data" / "samples" / "torch"
LEGACY = TORCH / "snapshot_legacy_history_flexgen.pickle"  # the densest sample: 6,803 containers in 110 kB
SNAPSHOT_HEAD = b"}X\x08\x00\x00\x00segments"  # a dict, then its first key: what the loader claims
PEEK = 1 << 17  # the C Unpickler fetches input 128 KiB at a time: the most built between two checks


@pytest.fixture(autouse=True)
def _default_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(limits.PICKLE_OBJECTS_ENV, raising=False)
    monkeypatch.delenv(limits.PICKLE_BYTES_ENV, raising=False)
    monkeypatch.delenv(limits.PICKLE_MEMORY_ENV, raising=False)


def _write(tmp_path: Path, data: bytes, name: str = "bomb.pickle") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


UNFRAMED = b"\x80\x02" + SNAPSHOT_HEAD  # protocol 2: fetched 128 KiB at a time
FRAMED = b"\x80\x04\x95" + struct.pack("<Q", len(SNAPSHOT_HEAD)) + SNAPSHOT_HEAD  # then unframed: per opcode


@pytest.mark.parametrize("head", [UNFRAMED, FRAMED], ids=["unframed", "framed-head"])
def test_list_bomb_is_refused_within_one_fetch_of_the_cap(tmp_path: Path, head: bytes) -> None:
    path = _write(tmp_path, head + b"]" * (8 << 20))  # 8M one-byte lists, never finished
    cap = limits.max_pickle_objects(path.stat().st_size)  # one per 8 bytes: ~1M
    with pytest.raises(InputError) as info:
        safepickle.load(path)
    err = info.value
    assert err.file == str(path)
    assert f"more than {cap} lists, dicts, tuples and sets" in err.message
    assert limits.PICKLE_OBJECTS_ENV in (err.expected or "")
    built = int((err.found or "").split()[0])
    assert cap < built <= cap + PEEK  # bounded: ~70 MiB of lists, not 8M of them (~500 MiB)


def _memo_bomb(index: int) -> bytes:
    return b"\x80\x02}r" + struct.pack("<I", index) + b"."  # {} stored at memo slot ``index``


needs_rlimit = pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="the address-space cap needs Linux")


@needs_rlimit
@pytest.mark.parametrize("index", [2**26, 2**31 - 1, 2**32 - 1])
def test_memo_bomb_is_refused_by_the_address_space_cap(tmp_path: Path, index: int) -> None:
    resource = pytest.importorskip("resource")
    before = resource.getrlimit(resource.RLIMIT_AS)
    path = _write(tmp_path, _memo_bomb(index))
    with pytest.raises(InputError) as info:
        safepickle.load(path)
    err = info.value
    assert err.file == str(path) and "pickle bomb" in err.message
    assert limits.PICKLE_MEMORY_ENV in (err.expected or "")
    assert resource.getrlimit(resource.RLIMIT_AS) == before  # the cap is lifted again


@needs_rlimit
def test_threads_loading_at_once_leave_the_limit_as_it_was(tmp_path: Path) -> None:
    resource = pytest.importorskip("resource")
    before = resource.getrlimit(resource.RLIMIT_AS)
    bomb = _write(tmp_path, _memo_bomb(2**31 - 1))

    def load(path: Path) -> str:
        try:
            return "loaded" if safepickle.load(path) is not None else "none"
        except InputError as exc:
            return "bomb" if "pickle bomb" in exc.message else exc.message

    paths = [bomb, LEGACY] * 8
    with ThreadPoolExecutor(max_workers=4) as pool:
        outcomes = list(pool.map(load, paths))
    assert outcomes == ["bomb", "loaded"] * 8
    assert resource.getrlimit(resource.RLIMIT_AS) == before


_LOAD_ONE = """
import sys
from memgate.errors import InputError
from memgate.readers import safepickle
try:
    print(repr(safepickle.load(sys.argv[1])))
except InputError as exc:
    print(exc.message)
"""


@needs_rlimit
def test_the_memory_override_admits_a_big_memo(tmp_path: Path) -> None:
    # In a fresh interpreter: the cap counts address space the load adds, and a process that has freed
    # 64 MiB inside its heap (whatever tests ran before in this one) serves the memo without adding any.
    path = _write(tmp_path, _memo_bomb(2**22))  # a 64 MiB memo (2 x 2^22 slots): over a 16 MiB cap, under 1 GiB

    def load(cap: str) -> str:
        env = {**os.environ, limits.PICKLE_MEMORY_ENV: cap}
        done = subprocess.run([sys.executable, "-c", _LOAD_ONE, str(path)], capture_output=True, text=True,
                              env=env, timeout=120, check=True)
        return done.stdout.strip()

    assert "pickle bomb" in load("16 MiB")
    assert load("1 GiB") == "{}"


def test_frame_bomb_is_refused_before_the_frame_is_handed_over(tmp_path: Path) -> None:
    body = SNAPSHOT_HEAD + b"]" * (8 << 20)
    path = _write(tmp_path, b"\x80\x04\x95" + struct.pack("<Q", len(body)) + body)
    with pytest.raises(InputError) as info:
        safepickle.load(path)
    assert f"a {len(body)}-byte FRAME that could build as many more" in (info.value.found or "")
    assert info.value.file == str(path)


def test_the_override_admits_a_dense_pickle_and_can_refuse_a_real_one(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    value: list[list[int]] = [[] for _ in range(limits.MIN_PICKLE_OBJECTS + 100_000)]  # valid: 2 bytes per list
    path = _write(tmp_path, pickle.dumps(value, protocol=4), "dense.pickle")
    with pytest.raises(InputError, match="lists, dicts, tuples and sets"):
        safepickle.load(path)
    monkeypatch.setenv(limits.PICKLE_OBJECTS_ENV, str(2 * len(value)))
    assert safepickle.load(path) == value
    monkeypatch.setenv(limits.PICKLE_OBJECTS_ENV, "1000")
    with pytest.raises(InputError, match="more than 1000 lists"):
        safepickle.load(LEGACY)
    monkeypatch.setenv(limits.PICKLE_OBJECTS_ENV, "lots")
    with pytest.raises(ConfigError, match=limits.PICKLE_OBJECTS_ENV):
        safepickle.load(LEGACY)


@pytest.mark.parametrize("path", sorted(TORCH.glob("*.pickle")), ids=lambda p: p.name)
def test_real_snapshots_fit_in_half_the_default_caps(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Room to spare: one container per 16 bytes is enough for every sample (the default: one per 8),
    and so is half the default memory (they take 6-8 times their size)."""
    size = path.stat().st_size
    monkeypatch.setenv(limits.PICKLE_OBJECTS_ENV, str(size // (2 * limits.PICKLE_BYTES_PER_OBJECT)))
    monkeypatch.setenv(limits.PICKLE_MEMORY_ENV, str((size * limits.PICKLE_MEMORY_PER_BYTE + limits.PICKLE_MEMORY_FLOOR) // 2))
    assert safepickle.load(path) is not None


PLAIN = {
    "segments": [{"address": 1 << 40, "blocks": [{"size": 512, "state": "inactive"}] * 3, "pool": (0, 1)}],
    "device_traces": [[{"action": "alloc", "addr": i, "size": -i, "time_us": 1.5 * i, "ok": i % 2 == 0}
                       for i in range(50_000)]],
    "big_bytes": bytes(range(256)) * 1000,  # 256 kB: written outside any frame, read with readinto
    "big_text": "é" * 200_000,
    "none": None,
}


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_plain_data_round_trips_in_every_protocol(tmp_path: Path, protocol: int) -> None:
    plain = PLAIN if protocol >= 3 else {k: v for k, v in PLAIN.items() if k != "big_bytes"}  # 2: bytes via a class
    path = _write(tmp_path, pickle.dumps(plain, protocol=protocol), f"plain{protocol}.pickle")
    assert safepickle.load(path) == plain


def test_text_opcodes_across_fetch_boundaries(tmp_path: Path) -> None:
    """INT and UNICODE read whole lines: lines that straddle a 128 KiB fetch, and one longer than it."""
    data = b"\x80\x02(" + b"I12345\n" * 40_000 + b"V" + b"x" * 300_000 + b"\nl."
    assert safepickle.load(_write(tmp_path, data)) == [12345] * 40_000 + ["x" * 300_000]


def test_trailing_bytes_are_found_at_the_exact_end(tmp_path: Path) -> None:
    data = pickle.dumps(PLAIN, protocol=4)
    path = _write(tmp_path, data + b"junk", "trailing.pickle")
    with pytest.raises(InputError, match="trailing bytes") as info:
        safepickle.load(path)
    assert info.value.column == f"byte {len(data)}"
    assert safepickle.load(_write(tmp_path, data + b"\x00" * 16, "padded.pickle")) == PLAIN  # NUL padding is fine
