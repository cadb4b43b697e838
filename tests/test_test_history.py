"""Marked tests have a memory history: saved, baselined and compared by their node id, like --memgate
profiles (a recording's folder is a new temporary one every run)."""

from __future__ import annotations

import json

import pytest
from helpers import skip_without_torch

TRAIN = """
import pytest
import torch
import torch.nn as nn


@pytest.mark.memgate(peak_allocated="1 GiB")
@pytest.mark.parametrize("width", [{width}])
def test_train(memgate_record, width):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        memgate_record.step()
"""


@pytest.fixture
def needs_torch() -> None:
    skip_without_torch()


def test_a_marked_test_is_saved_and_a_bigger_model_fails_the_comparison(pytester: pytest.Pytester,
                                                                         needs_torch: None) -> None:
    pytester.makepyfile(test_model=TRAIN.format(width=128))
    first = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--memgate-autosave",
                                          "--memgate-benchmark-json=bench.json", "--memgate-save-baseline=base.json")
    first.assert_outcomes(passed=1)
    first.stdout.fnmatch_lines(["memgate: run saved to *.memgate*"])
    [saved] = list((pytester.path / ".memgate").rglob("*.json"))
    paths = [p["path"] for p in json.loads(saved.read_text())["profiles"].values()]
    assert paths == ["test_model.py::test_train[128]"]  # the node id, not the temporary folder
    assert json.loads((pytester.path / "bench.json").read_text())  # not []
    assert "test_model.py::test_train[128]" in (pytester.path / "base.json").read_text()

    # the same test id with a model four times as wide: its peak grows, and the comparison says so
    pytester.makepyfile(test_model=TRAIN.format(width=128).replace("nn.Linear(64, width)", "nn.Linear(64, 4 * width)")
                        .replace("nn.Linear(width, 10)", "nn.Linear(4 * width, 10)"))
    second = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--memgate-compare",
                                           "--memgate-compare-fail=peak_allocated:5%")
    second.assert_outcomes(failed=1)
    second.stdout.fnmatch_lines(["*peak_allocated*", "compared with *"])
    second.stdout.fnmatch_lines(["FAILED test_model.py::test_train[[]128[]] - *peak_allocated*"])

    # and against the baseline file as well, with nothing changed: it passes
    pytester.makepyfile(test_model=TRAIN.format(width=128))
    third = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--memgate-baseline=base.json",
                                          "--memgate-compare-fail=peak_allocated:5%")
    third.assert_outcomes(passed=1)


def test_a_new_test_without_history_is_a_warning(pytester: pytest.Pytester, needs_torch: None) -> None:
    pytester.makepyfile(test_model=TRAIN.format(width=32))
    (pytester.path / "base.json").write_text("")  # replaced below by a real, empty-of-this-test baseline
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--memgate-save-baseline=base.json").assert_outcomes(
        passed=1)
    pytester.makepyfile(test_other=TRAIN.format(width=32).replace("test_train", "test_new"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_other.py", "--memgate-baseline=base.json",
                                           "--memgate-compare-fail=peak_allocated:5%")
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*nothing compared for test_other.py::test_new*"])


def test_saving_a_baseline_of_nothing_is_said(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--memgate-save-baseline=base.json")
    result.stdout.fnmatch_lines(["memgate: warning: --memgate-save-baseline=*base.json wrote nothing*"])
    assert not (pytester.path / "base.json").exists()
