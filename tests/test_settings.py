"""memgate.settings: the budget file and the profile root, found the same way by both shells, and the
plugin's options resolved from a lookup (command line, else ini) with every conflict refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memgate.errors import ConfigError
from memgate.settings import (
    KEPT_BESIDE_REPORT,
    Settings,
    Where,
    declared_root,
    find_budgets,
    leak_horizon,
    read_settings,
)

BUDGETS = '[[budgets]]\nname = "b"\npeak_allocated = "1 GiB"\n'


def _read(tmp_path: Path, given: dict[str, Any], *, cache_dir: Path | None = None) -> Settings:
    """The settings of options ``given`` (relative to ``tmp_path``); no test path to refuse."""
    def lookup(dest: str) -> tuple[Any, Path]:
        return given.get(dest), tmp_path

    return read_settings(lookup, Where(search=(tmp_path,), rootdir=tmp_path, check_root=lambda value, path: None,
                                       default_cache_dir=lambda: cache_dir))


def test_memgate_toml_wins_over_pyproject_and_the_first_folder_wins(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (second / "memgate.toml").write_text(BUDGETS)
    (first / "pyproject.toml").write_text("[tool.other]\nx = 1\n")  # no [tool.memgate]: not a budget file
    found = find_budgets(None, [first, second, second])
    assert found is not None and found.path == str(second / "memgate.toml")
    (first / "pyproject.toml").write_text("[tool.memgate]\n" + BUDGETS.replace("[[budgets]]", "[[tool.memgate.budgets]]"))
    found = find_budgets(None, [first, second])
    assert found is not None and found.path == str(first / "pyproject.toml")
    assert find_budgets(None, [tmp_path]) is None
    given = find_budgets(second / "memgate.toml", [first], default_leak_horizon=3)
    assert given is not None and given.budgets[0].leak_horizon_steps == 3


def test_the_declared_root_is_relative_to_the_budget_file(tmp_path: Path) -> None:
    (tmp_path / "memgate.toml").write_text('profiles = "prof"\n' + BUDGETS)
    assert declared_root(find_budgets(None, [tmp_path])) == tmp_path / "prof"
    (tmp_path / "memgate.toml").write_text(BUDGETS)
    assert declared_root(find_budgets(None, [tmp_path])) is None
    assert declared_root(None) is None


@pytest.mark.parametrize(("value", "ok"), [("1", True), (" 4 ", True), ("0004", True), ("0", False), ("-1", False),
                                           ("²", False), ("x", False), ("３", False), ("\u0663", False), ("1_0", False),
                                           ("9" * 5000, False), ("1e3", False), ("inf", False)])
def test_leak_horizon_is_an_integer_of_at_least_one(value: str, ok: bool) -> None:
    """In ASCII digits: int() reads '３' and '٣' as 3, '1_0' as 10, and raises on 5000 digits."""
    if ok:
        assert leak_horizon(value) == int(value)
    else:
        with pytest.raises(ConfigError, match="invalid --memgate-leak-horizon-steps") as info:
            leak_horizon(value)
        assert len(info.value.one_line()) < 200


def test_paths_are_taken_from_where_they_were_written(tmp_path: Path) -> None:
    (tmp_path / "memgate.toml").write_text('profiles = "prof"\n' + BUDGETS)
    settings = _read(tmp_path, {"memgate": "", "memgate_json": "out/r.json", "memgate_leak_horizon_steps": "2"},
                     cache_dir=tmp_path / "cache")
    assert settings.root == tmp_path / "prof"  # a bare --memgate: the budget file's profiles
    assert settings.json_path == tmp_path / "out" / "r.json"
    assert settings.keep_traces == tmp_path / "out" / KEPT_BESIDE_REPORT  # recordings outlive pytest's tmp
    assert settings.storage == tmp_path / ".memgate" and settings.cache_dir == tmp_path / "cache"
    assert settings.budget_file is not None and settings.budget_file.budgets[0].leak_horizon_steps == 2
    assert settings.wants_profiles and not settings.compares


@pytest.mark.parametrize(("given", "message"), [
    ({"memgate": ""}, "--memgate has no PATH and the budget file sets no 'profiles'"),
    ({"memgate_baseline": "b.json", "memgate_compare": ""}, "both name what to compare with"),
    ({"memgate_compare_fail": ["peak_allocated:5%"]}, "--memgate-compare-fail needs --memgate-baseline"),
    ({"memgate_ratchet": True}, "--memgate-ratchet needs --memgate-save-baseline"),
    ({"memgate_baseline_missing": "ignore"}, "invalid --memgate-baseline-missing 'ignore'"),
    ({"memgate_compare": "not an id"}, "invalid --memgate-compare 'not an id'"),
])
def test_options_that_cannot_be_resolved_are_refused(tmp_path: Path, given: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _read(tmp_path, given)


def test_a_root_that_names_tests_is_refused_by_the_shell_that_knows_them(tmp_path: Path) -> None:
    def refuse(value: str, path: Path) -> None:
        raise ConfigError(f"invalid --memgate {value!r}: a test file, not a profile")

    where = Where(search=(tmp_path,), rootdir=tmp_path, check_root=refuse, default_cache_dir=lambda: None)
    with pytest.raises(ConfigError, match="a test file"):
        read_settings(lambda dest: ("test_x.py" if dest == "memgate" else None, tmp_path), where)
