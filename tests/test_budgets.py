"""memgate.budgets: budgets from a budget file or a marker's keywords. Every error names the file and the
TOML line of the offending key (found with memgate.toml_lines), all of a file's errors at once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memgate.budgets import (
    BUDGET_KEYS,
    LIMITS,
    Budget,
    BudgetKeyError,
    budget_from_mapping,
    find_budget_file,
    load_budget_file,
    unknown_keys_message,
)
from memgate.errors import ConfigError
from memgate.marks import marker_budget
from memgate.rows import Declared
from memgate.sizes import UNITS as SIZE_UNITS


def _write(tmp_path: Path, text: str, name: str = "memgate.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, "utf-8")
    return path


TWO_BUDGETS = '''\
[[budgets]]
name = "train"
peak_allocated = "2 GiB"

[[budgets]]
name = "eval"
{line7}
'''


@pytest.mark.parametrize(
    ("line7", "message"),
    [
        ('peak_alocated = "1 GiB"', "unknown budget key 'peak_alocated' (did you mean 'peak_allocated'?)"),
        ('peak_reserved = "1 parsec"', "invalid eval.peak_reserved '1 parsec'"),
        ('fragmentation = 1.5', "1.5 is greater than the maximum of 1"),
        ('op_caps = { "aten::*" = "lots" }', "invalid eval.op_caps['aten::*'] 'lots'"),
        ('warmup_steps = "1"', "'1' is not of type 'integer'"),
        ('name_again = "train"', "duplicate budget name(s) 'train'"),
    ],
    ids=["misspelled-key", "bad-size", "bad-ratio", "bad-op-cap", "bad-type", "duplicate-name"],
)
def test_budget_file_errors_name_the_file_and_the_line_of_the_key(tmp_path: Path, line7: str, message: str) -> None:
    text = TWO_BUDGETS.format(line7=line7)
    if line7.startswith("name_again"):  # the second entry named like the first: its name line is the one
        text = TWO_BUDGETS.format(line7='peak_reserved = "1 GiB"').replace('"eval"', '"train"')
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_budget_file(path)
    expected_line = 6 if line7.startswith("name_again") else 7
    assert (info.value.file, info.value.line) == (str(path), expected_line)
    assert message in info.value.one_line()
    assert info.value.one_line().startswith(f"{path}:{expected_line}: ")


def test_pyproject_lines_count_from_the_top_of_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, '[project]\nname = "x"\n\n[[tool.memgate.budgets]]\nname = "a"\npeak_alocated = 1\n',
                  "pyproject.toml")
    with pytest.raises(ConfigError) as info:
        load_budget_file(path)
    assert info.value.line == 6
    assert "did you mean 'peak_allocated'" in info.value.message


def test_unknown_top_level_key_and_a_budget_without_limits(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_budget_file(_write(tmp_path, 'profile = "prof"\n'))
    assert info.value.line == 1 and "unknown key 'profile' (did you mean 'profiles'?)" in info.value.message
    with pytest.raises(ConfigError) as info:
        load_budget_file(_write(tmp_path, '\n[[budgets]]\nname = "empty"\n'))
    assert info.value.line == 2 and "sets no limit" in info.value.message


def test_toml_syntax_error_keeps_its_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_budget_file(_write(tmp_path, '[[budgets]]\nname = "a"\npeak_allocated = \n'))
    assert info.value.line == 3 and info.value.message.startswith("invalid TOML")


def test_budget_file_remembers_where_each_check_is_declared(tmp_path: Path) -> None:
    budgets = load_budget_file(_write(tmp_path, TWO_BUDGETS.format(line7='op_caps = { "cann::*" = "1 MiB" }')))
    assert budgets.line_of("train", "peak_allocated") == 3
    assert budgets.line_of("eval", "op_caps[cann::*]") == 7
    assert budgets.line_of("train", "leaked") == 1  # not declared: the entry


# ---- every error of a file at once, in file order --------------------------------------------------

MANY = '''\
profile = "prof"                         # 1: unknown top-level key
[[budgets]]                              # 2
name = "train"                           # 3
peak_alocated = "1 GiB"                  # 4: unknown budget key
op_caps = { "a" = "lots", "b" = "x" }    # 5: two bad sizes on one line
[[budgets]]                              # 6
name = "train"                           # 7: duplicate name
warmup_steps = "1"                       # 8: not an integer
fragmentation = 1.5                      # 9: above 1
rank_imbalance = { peak_alocated = 0.1 } # 10: unknown metric
[[budgets]]                              # 11
name = "quiet"                           # 12: sets no limit
'''


def test_every_budget_file_error_at_once_in_file_order(tmp_path: Path) -> None:
    path = _write(tmp_path, MANY)
    with pytest.raises(ConfigError) as info:
        load_budget_file(path)
    lines = info.value.lines()
    assert [line.split(": ", 1)[0] for line in lines] == [
        f"{path}:{n}" for n in (1, 4, 5, 5, 7, 8, 9, 10, 11)], "\n".join(lines)
    messages = [line.split(": ", 1)[1] for line in lines]
    for message, says in zip(messages, [
        "unknown key 'profile' (did you mean 'profiles'?)",
        "unknown budget key 'peak_alocated' (did you mean 'peak_allocated'?)",
        "invalid train.op_caps['a'] 'lots'",
        "invalid train.op_caps['b'] 'x'",
        "duplicate budget name(s) 'train'; expected unique names (also at line 3)",
        "'1' is not of type 'integer'",
        "1.5 is greater than the maximum of 1",
        "invalid train.rank_imbalance: unknown metric 'peak_alocated' (did you mean 'peak_allocated'?)",
        "budget 'quiet' sets no limit",
    ], strict=True):
        assert says in message, (says, message)
    assert len(set(lines)) == len(lines)  # one error, one line: the schema and the entry's own checks agree
    # the first is the one-line form a single error had; the rest ride along in file order
    assert info.value.one_line() == lines[0] and len(info.value.also) == len(lines) - 1


def test_one_error_stays_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_budget_file(_write(tmp_path, '[[budgets]]\nname = "a"\nleaked = "1 parsec"\n'))
    assert info.value.also == () and len(info.value.lines()) == 1 and info.value.line == 3


def test_marker_keywords_report_every_bad_key() -> None:
    with pytest.raises(BudgetKeyError) as info:
        budget_from_mapping({"peak_allocated": "lots", "fragmentation": 2, "warmup_steps": -1}, origin="marker",
                            default_name="t")
    assert info.value.key == "peak_allocated"  # the first, as before
    assert [getattr(e, "key", None) for e in info.value.also] == ["fragmentation", "warmup_steps"]


def test_unknown_keys_are_named_with_the_key_each_likely_means() -> None:
    assert unknown_keys_message(["peak_alocated"], BUDGET_KEYS) == (
        "unknown budget key 'peak_alocated' (did you mean 'peak_allocated'?)")
    assert unknown_keys_message(["peak_alocated", "zzz"], BUDGET_KEYS) == (
        "unknown budget keys 'peak_alocated' (did you mean 'peak_allocated'?), 'zzz'")  # no guess for nonsense
    assert unknown_keys_message(["profile"], ["profiles", "budgets"], "key") == (
        "unknown key 'profile' (did you mean 'profiles'?)")


def test_memgate_toml_wins_over_pyproject_and_a_pyproject_without_memgate_is_no_budget_file(tmp_path: Path) -> None:
    assert find_budget_file(tmp_path) is None
    _write(tmp_path, '[project]\nname = "x"\n', "pyproject.toml")
    assert find_budget_file(tmp_path) is None  # no [tool.memgate] table: not a budget file
    _write(tmp_path, '[[tool.memgate.budgets]]\nname = "from_pyproject"\nleaked = "1 MiB"\n', "pyproject.toml")
    found = find_budget_file(tmp_path)
    assert found is not None and [b.name for b in found.budgets] == ["from_pyproject"]
    _write(tmp_path, '[[budgets]]\nname = "from_memgate_toml"\nleaked = "1 MiB"\n')
    found = find_budget_file(tmp_path)
    assert found is not None and [b.name for b in found.budgets] == ["from_memgate_toml"]


# ---- limits as a share of the device's capacity ---------------------------------------------------


def _budget(**raw: Any) -> Budget:
    return budget_from_mapping({"name": "b", **raw}, origin="test")


def test_percent_parses_as_a_share() -> None:
    budget = _budget(peak_reserved="92%", op_caps={"mm*": "10 %"}, device_capacity="64 GiB")
    assert budget.shares == {"peak_reserved": 0.92, "op_caps[mm*]": 0.1}
    assert budget.device_capacity == 64 << 30
    assert budget.checks() == ["peak_reserved", "op_caps[mm*]"]
    assert budget.declared_limit("peak_reserved") == "92%"


@pytest.mark.parametrize("bad", ["0%", "-5%", "92 pct"])
def test_bad_percent(bad: str) -> None:
    with pytest.raises(ConfigError):
        _budget(peak_reserved=bad)


def test_percent_in_a_budget_file(tmp_path: Path) -> None:
    path = tmp_path / "memgate.toml"
    path.write_text('[[budgets]]\nname = "b"\npeak_reserved = "92%"\ndevice_capacity = "64 GiB"\n')
    [budget] = load_budget_file(path).budgets
    assert budget.shares == {"peak_reserved": 0.92}
    path.write_text('[[budgets]]\nname = "b"\npeak_reserved = "92%"\ndevice_capacity = "92%"\n')
    with pytest.raises(ConfigError, match="device_capacity"):
        load_budget_file(path)


# ---- rank_imbalance and owner_caps ------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "match"), [
    ({"rank_imbalance": {"peak_alocated": 0.1}}, "did you mean 'peak_allocated'"),
    ({"rank_imbalance": {"peak_allocated": 1.5}}, "a ratio between 0 and 1"),
    ({"rank_imbalance": 0.1}, "a table of metric = ratio"),
    ({"owner_caps": {"enc*": "lots"}}, "invalid b.owner_caps"),
])
def test_bad_keys(raw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError) as info:
        _budget(**raw)
    assert match in info.value.one_line()


def test_budget_file_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, '[[budgets]]\nname = "b"\nowner_caps = { "enc*" = "1 GiB" }\n'
                  'rank_imbalance = { peak_allocated = 0.05 }\n')
    loaded = load_budget_file(path)
    [budget] = loaded.budgets
    assert budget.owner_caps == {"enc*": 1 << 30} and budget.rank_imbalance == {"peak_allocated": 0.05}
    assert budget.checks() == ["owner_caps[enc*]"]
    assert budget.cross_rank_checks() == ["rank_imbalance[peak_allocated]"]
    assert loaded.line_of("b", "rank_imbalance[peak_allocated]") == 4


# ---- one reader of a size for markers and files -----------------------------------------------------

UNITS = "B, KiB, MiB, GiB, TiB (KB/MB/GB/TB and K/M/G/T mean the same binary units; any case)"
SIZE_CASES: list[tuple[object, int | str]] = [
    *((f"2 {unit}", 2 * factor) for unit, factor in SIZE_UNITS.items()),
    *((f"2{unit.lower()}", 2 * factor) for unit, factor in SIZE_UNITS.items()),
    *((f"2 {unit.upper()}", 2 * factor) for unit, factor in SIZE_UNITS.items()),
    ("64 kB", 64 << 10),
    ("64 KB", 64 << 10),
    ("64kb", 64 << 10),
    ("1.5 GiB", 3 << 29),
    (" 64 MiB ", 64 << 20),
    (1 << 30, 1 << 30),
    (2**56, 2**56),
    ("64 XB", f"invalid t.peak_allocated '64 XB': unknown unit 'XB'; expected one of {UNITS}"),
    ("24 PiB", f"invalid t.peak_allocated '24 PiB': unknown unit 'PiB'; expected one of {UNITS}"),
    ("1e3 MiB", f"invalid t.peak_allocated '1e3 MiB'; expected a number with a unit in {UNITS}"),
    ("64 MiB!", f"invalid t.peak_allocated '64 MiB!'; expected a number with a unit in {UNITS}"),
    ("\uff16\uff14 MiB", f"invalid t.peak_allocated '\uff16\uff14 MiB'; expected a number with a unit in {UNITS}"),
    ("-1 GiB", "invalid t.peak_allocated '-1 GiB': negative; expected a size >= 0"),
    (-1, "invalid t.peak_allocated: negative; expected a size >= 0, found '-1'"),
    ("1.5 B", "invalid t.peak_allocated '1.5 B': not a whole number of bytes; expected a whole byte count"),
    ("65537 TiB", "invalid t.peak_allocated '65537 TiB': past 64 PiB; expected a size up to 64 PiB (72057594037927936 bytes)"),
    (2**56 + 1, ("invalid t.peak_allocated: past 64 PiB; expected a size up to 64 PiB (72057594037927936 bytes), "
                 "found '72057594037927937'")),
    (1.5, f"invalid t.peak_allocated; expected a size string in {UNITS}, found '1.5'"),
]


def _toml_value(value: object) -> str:
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else str(value)


@pytest.mark.parametrize(("value", "want"), SIZE_CASES, ids=[repr(v) for v, _ in SIZE_CASES])
def test_a_size_reads_alike_in_a_marker_and_a_budget_file(tmp_path: Path, value: object, want: int | str) -> None:
    """The same bytes, or the same error: in a file on the line of its key, in a marker naming its test."""
    path = _write(tmp_path, f'[[budgets]]\nname = "t"\npeak_allocated = {_toml_value(value)}\n')
    if isinstance(want, int):
        [from_file] = load_budget_file(path).budgets
        assert from_file.limits["peak_allocated"] == want
        assert budget_from_mapping({"peak_allocated": value}, origin="m", default_name="t").limits == from_file.limits
        assert marker_budget("t.py::t", (), {"peak_allocated": value}, Declared("t.py", 3), has_profile_dir=True,
                             leak_horizon_steps=1).limits == from_file.limits
        return
    with pytest.raises(ConfigError) as in_file:
        load_budget_file(path)
    assert in_file.value.lines() == [f"{path}:3: {want}"]
    with pytest.raises(ConfigError) as in_marker:
        marker_budget("t.py::t", (), {"peak_allocated": value}, Declared("t.py", 3), has_profile_dir=True,
                      leak_horizon_steps=1)
    assert in_marker.value.lines() == [f"t.py:3: memgate marker of t.py::t: {want.replace('t.peak', 'marker.peak')}"]


def test_a_bad_size_in_each_place_of_a_file_lists_the_units(tmp_path: Path) -> None:
    path = _write(tmp_path, '[[budgets]]\nname = "t"\nleaked = "1 kB"\nop_caps = { "mm" = "2 XB" }\n'
                  'device_capacity = "3 parsecs"\nleft_allocated = "4 Mb"\n[budgets.owner_caps]\n"enc*" = "5 gigs"\n')
    with pytest.raises(ConfigError) as info:
        load_budget_file(path)
    assert info.value.lines() == [
        f"{path}:4: invalid t.op_caps['mm'] '2 XB': unknown unit 'XB'; expected one of {UNITS}",
        f"{path}:5: invalid t.device_capacity '3 parsecs': unknown unit 'parsecs'; expected one of {UNITS}",
        f"{path}:8: invalid t.owner_caps['enc*'] '5 gigs': unknown unit 'gigs'; expected one of {UNITS}",
    ]  # "1 kB" and "4 Mb" are sizes: 1 KiB and 4 MiB


# ---- every error of a budget file is its own line ---------------------------------------------------

MISSPELLED = '''\
[[budgets]]
name = "train"
peak_alocated = "1 GiB"
step_growth = "1 MiB"
leakd = "2 MiB"
zzz = 1
[budgets.rank_imbalance]
peak_allocated = 0.1
peak_reservd = 0.1
step_grwth = 0.2
'''


def test_each_misspelled_key_is_its_own_line_on_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, MISSPELLED)
    with pytest.raises(ConfigError) as info:
        load_budget_file(path)
    at = f"{path}:{{}}: invalid budget file at budgets/0: unknown budget key"
    assert info.value.lines() == [
        f"{at.format(3)} 'peak_alocated' (did you mean 'peak_allocated'?)",
        f"{at.format(5)} 'leakd' (did you mean 'leaked'?)",
        f"{at.format(6)} 'zzz'; expected one of {', '.join(sorted(BUDGET_KEYS))}",  # no key is close: all of them
        (f"{path}:9: invalid train.rank_imbalance: unknown metric 'peak_reservd' (did you mean 'peak_reserved'?); "
         f"expected one of {', '.join(LIMITS)}"),
        (f"{path}:10: invalid train.rank_imbalance: unknown metric 'step_grwth' (did you mean 'step_growth'?); "
         f"expected one of {', '.join(LIMITS)}"),
    ]


def test_each_misspelled_top_level_key_is_its_own_line(tmp_path: Path) -> None:
    path = _write(tmp_path, 'profile = "prof"\nbudget = []\n[[budgets]]\nname = "a"\nleaked = 1\n')
    with pytest.raises(ConfigError) as info:
        load_budget_file(path)
    assert info.value.lines() == [
        f"{path}:1: invalid budget file at (top level): unknown key 'profile' (did you mean 'profiles'?)",
        f"{path}:2: invalid budget file at (top level): unknown key 'budget' (did you mean 'budgets'?)",
    ]


def test_a_bad_ratio_and_an_unknown_metric_in_one_table_are_both_said(tmp_path: Path) -> None:
    path = _write(tmp_path, '[[budgets]]\nname = "a"\nleaked = 1\n[budgets.rank_imbalance]\n'
                  'peak_allocated = 1.5\npeak_alocated = 0.1\n')
    with pytest.raises(ConfigError) as info:
        load_budget_file(path)
    assert [line.split(": ", 2)[0] for line in info.value.lines()] == [f"{path}:5", f"{path}:6"]
    assert "1.5 is greater than the maximum of 1" in info.value.lines()[0]
    assert "unknown metric 'peak_alocated'" in info.value.lines()[1]


def test_each_misspelled_marker_keyword_is_its_own_error() -> None:
    with pytest.raises(ConfigError) as info:
        marker_budget("t.py::t", (), {"peak_alocated": "1 GiB", "leakd": 1, "step_growth": 1}, Declared("t.py", 3),
                      has_profile_dir=True, leak_horizon_steps=1)
    assert info.value.lines() == [
        "t.py:3: memgate marker of t.py::t: unknown budget key 'peak_alocated' (did you mean 'peak_allocated'?)",
        "t.py:3: memgate marker of t.py::t: unknown budget key 'leakd' (did you mean 'leaked'?)",
    ]
