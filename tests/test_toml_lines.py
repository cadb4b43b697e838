"""memgate.toml_lines: the 1-based line each key path of a TOML document is declared on, which budget-file
errors name. Each document is checked to be TOML by tomllib first where it is meant to be."""

from __future__ import annotations

import tomllib

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


NESTED = '''\
[[run]]
name = "a"
[[run.step]]
n = 1
[[run.step]]
n = 2
[[run]]
name = "b"
[[run.step]]
n = 3
[run.meta]
s = """ends \\""" here
[[run]]
"""
k = 1
'''


def test_arrays_of_tables_inside_arrays_of_tables_count_per_element() -> None:
    assert tomllib.loads(NESTED)["run"][1]["step"] == [{"n": 3}]  # the text is the TOML it claims to be
    lines = key_lines(NESTED)
    assert [lines[("run", 0, "step", i, "n")] for i in (0, 1)] == [4, 6]
    assert lines[("run", 1)] == 7
    assert lines[("run", 1, "step", 0)] == 9  # the second run's first step: its index starts again at 0
    assert lines[("run", 1, "step", 0, "n")] == 10
    assert lines[("run", 1, "meta")] == 11  # a sub-table of the array's last element
    assert lines[("run", 1, "meta", "s")] == 12
    assert ("run", 2) not in lines  # inside a multi-line string: its escaped quotes do not end it
    assert lines[("run", 1, "meta", "k")] == 15


LOOK_ALIKES = r"""
title = "a # not a comment"      # 1
[tool.memgate]                    # 2
profiles = 'prof'                 # 3
"quoted.key" = 1                  # 4
a . b = 2                         # 5
lit = '''                         # 6
[[not.a.table]]
'''                               # 8
"a\u0041" = "1 MiB"               # 9
arr = [                           # 10
  { inner = 1 },                  # 11
]                                 # 12
after = 1                         # 13
"""[1:]


def test_quoted_dotted_and_escaped_keys_and_literal_strings() -> None:
    assert tomllib.loads(LOOK_ALIKES)["tool"]["memgate"]["aA"] == "1 MiB"
    lines = key_lines(LOOK_ALIKES)
    assert lines[("title",)] == 1  # the '#' inside the string starts no comment
    assert lines[("tool", "memgate", "profiles")] == 3
    assert lines[("tool", "memgate", "quoted.key")] == 4  # one key: the dot is inside the quotes
    assert lines[("tool", "memgate", "a")] == lines[("tool", "memgate", "a", "b")] == 5  # spaces around the dot
    assert lines[("tool", "memgate", "lit")] == 6
    assert not any(path[0] == "not" for path in lines)  # a header inside a multi-line literal string is text
    assert lines[("tool", "memgate", "aA")] == 9  # a basic string key's escapes are decoded
    assert lines[("tool", "memgate", "arr")] == 10
    assert ("tool", "memgate", "arr", 0) not in lines and ("tool", "memgate", "inner") not in lines
    assert lines[("tool", "memgate", "after")] == 13  # the statement after the multi-line array
    assert line_of(lines, ("tool", "memgate", "arr", 0, "inner")) == 10  # inside the array: its key's line


def test_text_that_is_not_toml_gives_no_lines_and_no_error() -> None:
    assert key_lines("") == {}
    assert key_lines("= broken\n[[\nx y = 1\n") == {}
    assert line_of({}, ("budgets", 0)) is None
    assert line_of(key_lines("a = 1\n"), ()) is None  # the empty path has no prefix to fall back to
