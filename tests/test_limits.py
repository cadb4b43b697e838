"""memgate.readers.limits: the caps on what a file may hold (its bytes, rows, a pickle's objects and memory,
what a compressed file inflates to, a sqlite query's seconds), from the environment, and the refusals
that name the file and the variable to raise. Every loader against these caps: tests/test_corpus.py."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from memgate.errors import ConfigError, InputError
from memgate.readers import limits

UNITS = "B, KiB, MiB, GiB, TiB (KB/MB/GB/TB and K/M/G/T mean the same binary units; any case)"


@pytest.fixture(autouse=True)
def _defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("MEMGATE_MAX_")]:
        monkeypatch.delenv(name)


def test_default_limits_are_generous(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (limits.FILE_BYTES_ENV, limits.ROWS_ENV, limits.PICKLE_BYTES_ENV):
        monkeypatch.delenv(name, raising=False)
    assert limits.current() == limits.Limits(64 << 30, 2_000_000_000, 2 << 30)
    monkeypatch.setenv(limits.FILE_BYTES_ENV, "1 GiB")
    assert limits.max_pickle_bytes() == 1 << 30  # the smaller of the two caps


@pytest.mark.parametrize(("value", "says"), [
    ("lots", f"invalid $MEMGATE_MAX_FILE_BYTES 'lots'; expected a number with a unit in {UNITS}"),
    ("-5", "invalid $MEMGATE_MAX_FILE_BYTES '-5': negative; expected a size >= 0"),
    ("5 parsecs", f"invalid $MEMGATE_MAX_FILE_BYTES '5 parsecs': unknown unit 'parsecs'; expected one of {UNITS}"),
    ("0 B", "invalid $MEMGATE_MAX_FILE_BYTES: must be above 0; expected a size such as 64GiB, found '0 B'"),
])
def test_a_bad_size_cap_is_a_usage_error(monkeypatch: pytest.MonkeyPatch, value: str, says: str) -> None:
    monkeypatch.setenv(limits.FILE_BYTES_ENV, value)
    with pytest.raises(ConfigError) as info:
        limits.current()
    assert info.value.one_line() == says


def test_row_caps_are_whole_numbers_above_0(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, rows in (("1_000", 1000), (" 7 ", 7)):
        monkeypatch.setenv(limits.ROWS_ENV, value)
        assert limits.current().max_rows == rows
    for value in ("0", "1.5", "x"):
        monkeypatch.setenv(limits.ROWS_ENV, value)
        with pytest.raises(ConfigError) as info:
            limits.current()
        assert info.value.one_line() == (f"invalid $MEMGATE_MAX_ROWS; expected a whole number of rows above 0, "
                                         f"found {value!r}")


def test_caps_that_grow_with_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    assert limits.max_pickle_objects(100) == 1 << 20  # a small file is never refused for its objects
    assert limits.max_pickle_objects(80 << 20) == 10 << 20  # one per 8 bytes
    assert limits.max_pickle_memory(1 << 20) == 32 * (1 << 20) + (256 << 20)
    assert limits.max_inflated_bytes(1000) == 16 << 20  # at least 16 MiB
    assert limits.max_inflated_bytes(1 << 20) == 100 << 20  # 100x the compressed file
    monkeypatch.setenv(limits.INFLATED_BYTES_ENV, "1 GiB")
    monkeypatch.setenv(limits.PICKLE_OBJECTS_ENV, "5")
    assert (limits.max_inflated_bytes(1000), limits.max_pickle_objects(80 << 20)) == (1 << 30, 5)


def test_a_file_over_the_size_cap_is_refused_naming_how_to_raise_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "trace.json"
    path.write_bytes(b"x" * 1000)
    assert limits.check_file_size(path) == 1000
    assert limits.check_file_size(tmp_path / "missing.json") == 0  # the reader's own checks name a missing file
    with pytest.raises(InputError) as info:
        limits.check_file_size(path, limit=999, why="a manifest is small")  # a fixed cap below the configured one
    assert info.value.one_line() == (f"{path}: file is 1000 B, over the 999 B size limit; expected at most 999 bytes "
                                     "(a manifest is small), found '1000 bytes'")
    monkeypatch.setenv(limits.FILE_BYTES_ENV, "999")
    with pytest.raises(InputError) as info:
        limits.check_file_size(path, limit=5000, why="a manifest is small")  # the configured cap is the lower one
    assert info.value.expected == "at most 999 bytes (raise the limit with $MEMGATE_MAX_FILE_BYTES)"
    monkeypatch.setenv(limits.FILE_BYTES_ENV, "1000")
    assert limits.check_file_size(path) == 1000  # at the cap: fine


def test_rows_over_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(limits.ROWS_ENV, "10")
    limits.check_rows(tmp_path / "trace.json", 10)
    with pytest.raises(InputError) as info:
        limits.check_rows(tmp_path / "trace.json", 11, what="events", column="traceEvents")
    assert info.value.one_line() == (f"{tmp_path / 'trace.json'}: column 'traceEvents': 11 events, over the limit of "
                                     "10; expected at most 10 events per file (raise the limit with $MEMGATE_MAX_ROWS), "
                                     "found '11 events'")


def test_an_inflating_stream_stops_one_byte_past_its_cap(tmp_path: Path) -> None:
    path = tmp_path / "trace.json.gz"
    path.write_bytes(b"x" * 1000)  # the compressed size the default cap grows with
    raw = io.BytesIO(b"y" * (16 << 20) + b"z" * (1 << 20))
    stream = limits.InflateCap(raw, path)
    assert (stream.cap, stream.compressed) == (16 << 20, 1000)
    read = 0
    with pytest.raises(InputError) as info:
        while data := stream.read(1 << 20):
            read += len(data)
    assert read == 16 << 20 and raw.tell() == (16 << 20) + 1  # never asked for more than one byte past it
    assert info.value.message == "the compressed file inflates past the 16.00 MiB limit on decompressed bytes"
    assert info.value.found == "more than 16777216 bytes from a 1000-byte file"
    assert "raise the limit with $MEMGATE_MAX_INFLATED_BYTES" in (info.value.expected or "")


@pytest.mark.parametrize("value", ["0", "-1", "soon", "1e3", "²"])
def test_a_bad_query_budget_is_a_usage_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(limits.QUERY_SECONDS_ENV, value)
    with pytest.raises(ConfigError, match=limits.QUERY_SECONDS_ENV):
        limits.max_query_seconds()
    monkeypatch.setenv(limits.QUERY_SECONDS_ENV, "")
    assert limits.max_query_seconds() == limits.DEFAULT_MAX_QUERY_SECONDS
    monkeypatch.setenv(limits.QUERY_SECONDS_ENV, "0.5")
    assert limits.max_query_seconds() == 0.5
