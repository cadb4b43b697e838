"""memgate.judge: a check judged on a profile's device metrics (the worst selected device, against a
limit resolved on that device), owner caps, and rank_imbalance over the ranks a budget selects."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import computed_cache

from memgate.budgets import Budget, budget_from_mapping
from memgate.errors import ConfigError, NotMeasurable, NotSelected, SelectsNothing
from memgate.judge import (
    Offered,
    RankValue,
    judge,
    judge_profile,
    judge_rank_imbalance,
    judge_selection,
    rank_value,
    selects_nothing,
)
from memgate.metric_cache import MetricCache
from memgate.metrics import DeviceMetrics


def _cache(values: dict[str, Any], metadata: dict[str, Any] | None = None, devices: tuple[str, ...] = ("npu:0",),
           ) -> MetricCache:
    return computed_cache([DeviceMetrics(d, "blocks", "f", dict(values), {}, 10, None) for d in devices], metadata)


def _budget(**raw: Any) -> Budget:
    return budget_from_mapping({"name": "b", **raw}, origin="test")


# ---- limits as a share of the capacity -----------------------------------------------------------


@pytest.mark.parametrize(("value", "passes"), [(500, True), (501, False)])
def test_capacity_recorded_in_the_profile(value: int, passes: bool) -> None:
    cache = _cache({"peak_reserved_bytes": value}, {"device_capacity_bytes": {"npu:0": 1000}})
    outcome = judge(cache, _budget(peak_reserved="50%", device_capacity="1 GiB"), "peak_reserved")  # the profile wins
    assert (outcome.limit, outcome.passed) == (500, passes)
    assert "limit 50% of 1000 B (recorded in the profile) = 500 bytes" in outcome.message


def test_capacity_from_the_budget() -> None:
    outcome = judge(_cache({"peak_reserved_bytes": 900}), _budget(peak_reserved="90%", device_capacity=1000),
                    "peak_reserved")
    assert (outcome.limit, outcome.passed) == (900, True)
    assert "limit 90% of 1000 B (device_capacity of budget 'b') = 900 bytes" in outcome.message


def test_worst_device_against_its_own_capacity() -> None:
    cache = _cache({"peak_reserved_bytes": 600}, {"device_capacity_bytes": {"npu:0": 2000, "npu:1": 1000}},
                   devices=("npu:0", "npu:1"))
    outcome = judge(cache, _budget(peak_reserved="50%"), "peak_reserved")
    assert (outcome.device, outcome.limit, outcome.passed) == ("npu:1", 500, False)


def test_no_capacity_says_what_to_add() -> None:
    with pytest.raises(ConfigError) as info:
        judge(_cache({"peak_reserved_bytes": 1}), _budget(peak_reserved="50%"), "peak_reserved")
    assert "needs the capacity of npu:0" in info.value.one_line()
    assert "device_capacity" in info.value.one_line()


# ---- owner caps ----------------------------------------------------------------------------------

OWNERS = {"encoder.layer1": 600, "encoder.layer0": 300, "decoder": 200, "(other)": 50}


@pytest.mark.parametrize(("cap", "passes"), [(900, True), (899, False)])
def test_owner_caps_sum_matching_owners(cap: int, passes: bool) -> None:
    outcome = judge(_cache({"owner_bytes_at_peak": OWNERS}), _budget(owner_caps={"encoder.*": cap}), "owner_caps[encoder.*]")
    assert (outcome.value, outcome.passed) == (900, passes)
    assert "largest owner encoder.layer1 600 B" in outcome.message


def test_owner_caps_no_match_names_the_owners() -> None:
    with pytest.raises(NotMeasurable, match=r"no owner .* matches 'mlp\*' \(owners: \(other\), decoder"):
        judge(_cache({"owner_bytes_at_peak": OWNERS}), _budget(owner_caps={"mlp*": 1}), "owner_caps[mlp*]")
    with pytest.raises(NotMeasurable, match="records no owners"):
        judge(_cache({"owner_bytes_at_peak": {}}), _budget(owner_caps={"mlp*": 1}), "owner_caps[mlp*]")


# ---- across ranks --------------------------------------------------------------------------------


def _values(*pairs: tuple[str, int]) -> list[RankValue]:
    return [RankValue(f"p{rank}", rank, value, "npu:0") for rank, value in pairs]


def test_judge_rank_imbalance_exact() -> None:
    budget = _budget(rank_imbalance={"peak_allocated": 0.25})
    row = judge_rank_imbalance(budget, "peak_allocated", _values(("0", 400), ("1", 300), ("2", 350))).as_json()
    assert (row["value"], row["passed"], row["worst_rank"], row["best_rank"]) == (0.25, True, "0", "1")
    row = judge_rank_imbalance(budget, "peak_allocated", _values(("0", 400), ("1", 299))).as_json()
    assert row["passed"] is False
    assert row["message"].endswith("worst rank 0 npu:0 400 B, best rank 1 npu:0 299 B")


def test_judge_rank_imbalance_selects_ranks() -> None:
    budget = _budget(ranks="0,1", rank_imbalance={"peak_allocated": 0.0})
    row = judge_rank_imbalance(budget, "peak_allocated", _values(("0", 100), ("1", 100), ("2", 1)))
    assert row.passed is True and row.rank == "0,1"
    with pytest.raises(NotMeasurable, match="needs at least two ranks"):
        judge_rank_imbalance(_budget(ranks="2", rank_imbalance={"peak_allocated": 0.0}), "peak_allocated",
                             _values(("0", 1), ("2", 1)))
    missing = [*_values(("0", 1)), RankValue("p1", "1", None, None, "no series")]
    with pytest.raises(NotMeasurable, match="not measurable on rank 1: no series"):
        judge_rank_imbalance(budget, "peak_allocated", missing)


# ---- which devices, which rows -------------------------------------------------------------------


def test_a_budget_for_other_devices_is_not_selected() -> None:
    cache = _cache({"peak_allocated_bytes": 10}, devices=("npu:0",))
    with pytest.raises(NotSelected, match="selects devices='cuda:\\*', the profile has npu:0"):
        judge(cache, _budget(peak_allocated=100, devices="cuda:*"), "peak_allocated")


# A run of two profiles: rank 0 on npu:0 (with the host's cpu), rank 1 on npu:1.
RUN = [Offered("0", ("npu:0", "cpu")), Offered("1", ("npu:1",))]


@pytest.mark.parametrize(("selection", "message"), [
    ({"devices": "cuda:*"}, "budget 'b': devices 'cuda:*' selects no device of the run (it has npu:0, cpu, npu:1)"),
    ({"ranks": "7"}, "budget 'b': ranks '7' selects no rank of the run (it has 0, 1)"),
    ({"ranks": "rank7, 8"}, "budget 'b': ranks 'rank7, 8' selects no rank of the run (it has 0, 1)"),
    ({"ranks": "1", "devices": "npu:0"},
     "budget 'b': devices 'npu:0' selects no device of the ranks '1' selects in the run (they have npu:1)"),
])
def test_a_budget_that_selects_nothing_in_the_run_names_what_it_selects_and_what_the_run_has(
        selection: dict[str, str], message: str) -> None:
    error = selects_nothing(_budget(peak_allocated=1, **selection), RUN)
    assert isinstance(error, SelectsNothing) and isinstance(error, ConfigError)
    assert error.message == message
    assert error.one_line().endswith("; expected ranks and devices that select a device of the run, or "
                                     "--memgate-allow-unselected where they are optional")


@pytest.mark.parametrize("selection", [{}, {"devices": "npu:*"}, {"devices": "cpu"}, {"ranks": "1", "devices": "npu:1"},
                                       {"ranks": "rank0", "devices": "cuda:*, cpu"}])
def test_a_budget_that_selects_one_device_of_the_run_selects_something(selection: dict[str, str]) -> None:
    assert selects_nothing(_budget(peak_allocated=1, **selection), RUN) is None


def test_a_run_with_no_readable_profile_leaves_the_word_to_its_load_errors() -> None:
    assert selects_nothing(_budget(peak_allocated=1, devices="cuda:*"), []) is None


def test_the_error_lists_ten_names_and_counts_the_rest() -> None:
    run = [Offered(str(r), (f"npu:{r}",)) for r in range(30)]
    error = selects_nothing(_budget(peak_allocated=1, ranks="99"), run)
    assert error is not None
    assert error.message == "budget 'b': ranks '99' selects no rank of the run (it has 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 20 more)"


def test_judge_selection_gives_an_error_row_per_check_of_each_budget_that_selects_nothing() -> None:
    budgets = [_budget(peak_allocated=1, leaked=1, devices="cuda:*"), _budget(name="fine", peak_allocated=1)]
    rows = judge_selection(budgets, RUN, "root")
    assert list(rows) == ["b"]
    assert [(r.profile, r.budget, r.metric, r.passed, r.skipped) for r in rows["b"]] == [
        ("root", "b", "peak_allocated", None, None), ("root", "b", "leaked", None, None)]
    assert rows["b"][0].error is not None and "devices 'cuda:*' selects no device of the run" in rows["b"][0].error


def test_the_verdict_line_names_the_worst_device_and_the_limit_boundary_passes() -> None:
    cache = _cache({"peak_allocated_bytes": 1024}, devices=("npu:0", "npu:1"))
    outcome = judge(cache, _budget(peak_allocated=1024), "peak_allocated")
    assert outcome.passed and outcome.message == "peak_allocated 1.00 KiB within budget 1.00 KiB — rank 0 npu:0"
    outcome = judge(cache, _budget(peak_allocated=1023), "peak_allocated")
    assert not outcome.passed and outcome.message.startswith("peak_allocated 1.00 KiB exceeds budget 1023 B by 1 B")


def test_judge_profile_gives_a_row_per_check_judged_or_not() -> None:
    cache = _cache({"peak_allocated_bytes": 10})
    rows = judge_profile(cache, [_budget(peak_allocated=100, leaked=1), _budget(name="other", ranks="7", leaked=1)])
    assert [(r.budget, r.metric, r.passed) for r in rows] == [("b", "peak_allocated", True), ("b", "leaked", None)]
    assert rows[1].error is not None and "leaked is not measurable" in rows[1].error


def test_rank_value_is_the_worst_selected_device_or_why_not() -> None:
    cache = _cache({"peak_allocated_bytes": 5}, devices=("npu:0", "npu:1"))
    assert rank_value(cache, _budget(peak_allocated=1), "peak_allocated").value == 5
    missing = rank_value(cache, _budget(peak_allocated=1), "leaked")
    assert missing.value is None and "npu:0: no data" in missing.why


def test_a_rank_imbalance_row_carries_both_ends() -> None:
    row = judge_rank_imbalance(_budget(rank_imbalance={"peak_allocated": 0.5}), "peak_allocated",
                               _values(("0", 400), ("1", 300)), "root")
    assert row.profile == "root" and row.metric == "rank_imbalance[peak_allocated]"
    assert row.spread is not None and (row.spread.worst_profile, row.spread.best_profile) == ("p0", "p1")
