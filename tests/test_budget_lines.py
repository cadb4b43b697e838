"""Budget-file errors name the file and the TOML line of the offending key (memgate.toml_lines)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memgate.budgets import load_budget_file
from memgate.errors import ConfigError
from memgate.toml_lines import key_lines, line_of

# Line numbers are written next to each line, so every expectation below is read off the text.
DOCUMENT = '''\
profiles = "prof"                        # 1
                                         # 2
[[budgets]]                              # 3
name = "train"                           # 4
peak_allocated = "2 GiB"                 # 5
op_caps = { "aten::mm" = "1 GiB" }       # 6
                                         # 7
[[budgets]]                              # 8
name = "eval"                            # 9
note = """a [[budgets]] look-alike       # 10
[[budgets]]
peak_reserved = "x"
"""                                      # 13
ranks = [                                # 14
  "[0]",                                 # 15
]                                        # 16
"peak_reserved" = "3 GiB"                # 17
                                         # 18
[budgets.op_caps]                        # 19
"cann::*" = "1 MiB"                      # 20
'aten::*'.x = 1                          # 21
'''


def test_key_lines_of_arrays_of_tables_quoted_keys_and_multiline_values() -> None:
    lines = key_lines(DOCUMENT)
    assert lines[("profiles",)] == 1
    assert lines[("budgets", 0)] == 3
    assert lines[("budgets", 0, "peak_allocated")] == 5
    assert lines[("budgets", 0, "op_caps")] == 6
    assert lines[("budgets", 1)] == 8
    assert lines[("budgets", 1, "note")] == 10
    assert ("budgets", 2) not in lines  # the look-alike inside the multi-line string is text
    assert lines[("budgets", 1, "ranks")] == 14
    assert lines[("budgets", 1, "peak_reserved")] == 17  # a quoted key, after the multi-line array
    assert lines[("budgets", 1, "op_caps")] == 19  # a sub-table of the array's last element
    assert lines[("budgets", 1, "op_caps", "cann::*")] == 20
    assert lines[("budgets", 1, "op_caps", "aten::*", "x")] == 21


def test_line_of_falls_back_to_the_longest_declared_prefix() -> None:
    lines = key_lines(DOCUMENT)
    assert line_of(lines, ("budgets", 0, "op_caps", "aten::mm")) == 6  # inside an inline table
    assert line_of(lines, ("budgets", 0, "leaked")) == 3  # not written: the entry's header
    assert line_of(lines, ("nothing",)) is None


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
    from memgate.budgets import BudgetKeyError, budget_from_mapping

    with pytest.raises(BudgetKeyError) as info:
        budget_from_mapping({"peak_allocated": "lots", "fragmentation": 2, "warmup_steps": -1}, origin="marker",
                            default_name="t")
    assert info.value.key == "peak_allocated"  # the first, as before
    assert [getattr(e, "key", None) for e in info.value.also] == ["fragmentation", "warmup_steps"]
