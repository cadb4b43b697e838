"""memgate.documents: memgate's own JSON documents (reports, baselines, saved runs) read back as untrusted
input, on small hand-written files. Each refusal is one InputError naming the file and the JSON path;
what no memgate writer writes (NaN, huge numbers, a key twice, deep nesting) is refused where it is.

The same refusals end to end, on real outputs corrupted (the CLI's exit 2, pytest's error item, the
profile cache): tests/test_untrusted_reports.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memgate import __version__
from memgate.baselines import baseline_from_entries
from memgate.documents import (
    json_path,
    load_baseline,
    load_entries,
    load_report,
    looks_like_memgate_json,
    read_json_document,
    schema_error,
    version_tuple,
)
from memgate.errors import InputError, show
from memgate.report import build_report

NUMBER = "expected a finite JSON number within what memgate writes"


def _write(tmp_path: Path, content: bytes | str | dict[str, Any], name: str = "doc.json") -> Path:
    path = tmp_path / name
    if isinstance(content, dict):
        content = json.dumps(content)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def _refused(path: Path, what: str = "baseline") -> str:
    with pytest.raises(InputError) as info:
        read_json_document(path, what)
    assert info.value.file == str(path)
    return info.value.one_line().removeprefix(f"{path}")


def test_json_path() -> None:
    assert json_path([]) == "$"
    assert json_path(["profiles", "0", "devices", "npu:0", "metrics", "peak_allocated_bytes"]) == (
        'profiles["0"].devices["npu:0"].metrics.peak_allocated_bytes')
    assert json_path(["profiles", 0, "a b"]) == 'profiles[0]["a b"]'


REFUSED: dict[str, tuple[bytes, str]] = {  # the bytes of a file -> what its one-line error says after the path
    "nan": (b'{"a": [1, NaN]}', (
        f": column 'a[1]': not a memgate baseline: NaN is not a JSON number (no memgate writer writes it); {NUMBER}, "
        "found 'NaN'")),
    "infinity": (b'{"a": {"b": -Infinity}}', (
        ": column 'a.b': not a memgate baseline: -Infinity is not a JSON number (no memgate writer writes it); "
        f"{NUMBER}, found '-Infinity'")),
    "41_digits": (b'{"a": ' + b"9" * 41 + b"}", (
        f": column 'a': not a memgate baseline: an integer of more than 40 digits; {NUMBER}, "
        "found '99999999999999999999... (41 digits)'")),
    "past_float": (b'{"a": 1e400}', (
        f": column 'a': not a memgate baseline: a number past the float range; {NUMBER}, found '1e400'")),
    "key_twice": (b'{"a": 1, "b": {"c": 1, "c": 2}}', (
        ": column 'b.c': not a memgate baseline: the key 'c' twice in one object (no memgate writer repeats one); "
        "expected a memgate baseline, found 'c'")),
    "not_utf8": (b'{"a": "\xff"}', (
        ": not UTF-8 text at byte 7; expected a memgate baseline (UTF-8 JSON), found 'b\\'\\\\xff\"}\\''")),
    "truncated": (b'{"a": [1,\n 2', (
        ":2: column 'char 3': invalid JSON: Expecting ',' delimiter (the file ends early: truncated?); "
        "expected a memgate baseline")),
    "syntax": (b'{"a": 1,, }', (
        ":1: column 'char 9': invalid JSON: Expecting property name enclosed in double quotes; "
        "expected a memgate baseline")),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_no_memgate_writer_writes_is_refused_where_it_is(tmp_path: Path, case: str) -> None:
    raw, says = REFUSED[case]
    assert _refused(_write(tmp_path, raw)) == says


def test_limits_of_a_document(tmp_path: Path) -> None:
    assert read_json_document(_write(tmp_path, b'{"a": ' + b"9" * 40 + b"}"), "baseline") == {"a": int("9" * 40)}
    deepest = b"[" * 65 + b"]" * 65  # 65 levels: the outermost list and 64 inside it
    assert read_json_document(_write(tmp_path, deepest), "baseline") == json.loads(deepest)
    says = _refused(_write(tmp_path, b"[" * 66 + b"]" * 66))
    assert says.startswith(": column '[0][0][0]") and says.endswith(": not a memgate baseline: values nested more than "
                                                                    "64 deep; expected a memgate baseline, found '...'")
    assert _refused(tmp_path / "missing.json") == ": baseline file not found"
    assert _refused(tmp_path, "JSON report") == ": JSON report is a directory; expected a memgate JSON report file"


def test_looks_like_memgate_json(tmp_path: Path) -> None:
    assert looks_like_memgate_json(_write(tmp_path, f'{{"memgate_version": "{__version__}"}}', "r.json"))
    assert looks_like_memgate_json(_write(tmp_path, '  {"memgate_baseline": 1}', "b.json"))
    assert not looks_like_memgate_json(_write(tmp_path, '{"traceEvents": []}', "trace.json"))
    assert not looks_like_memgate_json(_write(tmp_path, f'{{"memgate_version": "{__version__}"}}', "r.txt"))
    assert not looks_like_memgate_json(tmp_path / "missing.json")


def test_version_tuple() -> None:
    assert [version_tuple(v) for v in ("0.1.0", "1.2.3rc1", "1.2+local", "abc", "")] == [
        (0, 1, 0), (1, 2, 3), (1, 2), None, None]


# ---- reports and baselines --------------------------------------------------------------------------------


def test_a_baseline_and_a_report_read_back_as_written(tmp_path: Path) -> None:
    baseline = baseline_from_entries([], commit="a" * 40, dirty=False)
    path = _write(tmp_path, baseline, "base.json")
    assert load_baseline(path) == baseline and load_entries(path) == []
    report = build_report([], [])
    path = _write(tmp_path, report, "report.json")
    assert load_report(path) == report and load_entries(path) == []
    assert load_baseline(path) == baseline_from_entries([])  # a JSON report works as a baseline too


def test_a_document_that_is_neither_says_what_it_holds(tmp_path: Path) -> None:
    expected = '{"memgate_baseline": 1, "profiles": {...}} or a JSON report'
    with pytest.raises(InputError) as info:
        load_baseline(_write(tmp_path, {"x": 1, "y": 2}))
    assert info.value.one_line().endswith(
        f": not a memgate baseline or JSON report; expected {expected}, found \"an object with the keys 'x', 'y'\"")
    with pytest.raises(InputError) as info:
        load_baseline(_write(tmp_path, "[1]"))
    assert info.value.found == "[1]"


def test_a_newer_layout_or_memgate_says_upgrade(tmp_path: Path) -> None:
    baseline = baseline_from_entries([], commit="a" * 40, dirty=False)
    with pytest.raises(InputError) as info:
        load_baseline(_write(tmp_path, {**baseline, "memgate_baseline": 2}))
    assert (info.value.column, info.value.expected, info.value.found) == ("memgate_baseline", "layout 1", "2")
    assert "upgrade memgate to read it" in info.value.message
    with pytest.raises(InputError) as info:
        load_baseline(_write(tmp_path, {**baseline, "memgate_version": "99.0"}))
    assert info.value.message == (f"written by memgate 99.0, newer than this memgate {__version__}: upgrade memgate to "
                                  "read this baseline")


def test_schema_errors_name_the_json_path_what_was_expected_and_what_was_found(tmp_path: Path) -> None:
    report = build_report([], [])
    found = {
        "string": ({**report, "profiles": "x"}, "profiles", "expected an array, found \"the string 'x'\""),
        "object": ({**report, "profiles": {}}, "profiles", "expected an array, found 'an object {}'"),
        "float": ({**report, "budgets": 1.5}, "budgets", "expected an array, found 'the float 1.5'"),
    }
    for doc, column, says in found.values():
        error = schema_error(doc, "report", file="f.json", what="JSON report")
        assert error is not None and error.one_line() == (
            f"f.json: column '{column}': not a memgate JSON report: wrong type; {says}")
    assert schema_error(report, "report", file="f.json", what="JSON report") is None
    with pytest.raises(InputError) as info:
        load_report(_write(tmp_path, {**report, "profiles": [{"path": "p"}]}))
    assert (info.value.column, info.value.message, info.value.found) == (
        "profiles[0]", "not a memgate JSON report: a key is missing", "no such key")


# ---- hostile sizes: every error bounded, at the element it is about ---------------------------------

BIG = 100_000  # characters of a hostile string value or key


def _bounded(make: Any) -> InputError:
    with pytest.raises(InputError) as info:
        make()
    assert len(info.value.one_line()) < 600, len(info.value.one_line())
    return info.value


@pytest.mark.parametrize(("version", "newer"), [("99.0" + "x" * BIG, True), ("1" * BIG, True), ("x" * BIG, False),
                                               ("0.1" + "\n" * BIG, False)])
def test_a_huge_memgate_version_is_shown_bounded(tmp_path: Path, version: str, newer: bool) -> None:
    """100 KB of text as memgate_version gave a 260,283-character error line."""
    baseline = baseline_from_entries([], commit="a" * 40, dirty=False)
    path = _write(tmp_path, {**baseline, "memgate_version": version})
    error = _bounded(lambda: load_baseline(path))
    assert error.column == "memgate_version" and error.file == str(path)
    if newer:  # named as such, its text cut
        assert error.message.startswith(f"written by memgate '{version[:10]}")
        assert "..., newer than this memgate" in error.message
    else:
        assert error.message == "not a memgate baseline: fails the schema's 'maxLength' check"
        assert error.expected == "at most 64 characters"
    error = _bounded(lambda: load_baseline(_write(tmp_path, {**baseline, "memgate_baseline": 2,
                                                              "memgate_version": "0.0" + "y" * BIG})))
    assert error.column == "memgate_baseline" or error.column == "memgate_version"


def test_a_huge_key_is_shown_bounded(tmp_path: Path) -> None:
    key = "d" * BIG
    error = _bounded(lambda: load_baseline(_write(tmp_path, f'{{"memgate_baseline": 1, "{key}": 1, "{key}": 2}}')))
    assert error.message.startswith("not a memgate baseline: the key 'ddd") and error.message.endswith(
        "... twice in one object (no memgate writer repeats one)")
    assert error.column is not None and error.column.startswith("['ddd") and len(error.column) < 60
    baseline = baseline_from_entries([], commit="a" * 40, dirty=False)
    error = _bounded(lambda: load_baseline(_write(tmp_path, {**baseline, "profiles": {key: {"x": 1}}})))
    assert error.column is not None and error.column.startswith("profiles['ddd") and len(error.column) < 60
    assert json_path(["profiles", key]) == f"profiles[{show(key, 40)}]"
