"""What a test leaves behind: ``left_allocated`` (memgate.leftover), judged on the blocks allocated in the
window and still allocated at its end, and ``--memgate-report-left``.

The ground truth is a real torch test that keeps exactly N bytes alive in a module-level list: it
fails ``left_allocated="0 B"`` naming the holder and passes ``left_allocated=N``; the same pytester run
gates a tracked AdamW step with ``category_caps`` at its exact optimizer-state bytes, computed from the
model's shapes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import SAMPLES, ring_buffer_cut, skip_without_torch

from memgate.budgets import budget_from_mapping
from memgate.discover import discover, load
from memgate.errors import ConfigError, NotMeasurable
from memgate.judge import judge
from memgate.leftover import left_behind
from memgate.metric_cache import MetricCache
from memgate.model import DeviceModel, Profile
from memgate.outputs import left_lines
from memgate.table import Ints, Table, Texts

N = 300_007  # odd: no allocator rounding makes it up
_LEFT = budget_from_mapping({"left_allocated": "1 GiB", "leaked": "1 GiB"}, origin="t", default_name="t")


def _profile(rows: list[tuple[int, int | None, int | None, str]], **metadata: object) -> Profile:
    """A CPU profile of blocks (size, t_alloc, t_free, op)."""
    n = len(rows)
    blocks = Table({
        "size": Ints.of([r[0] for r in rows]), "t_alloc": Ints.of_optional([r[1] for r in rows]),
        "t_free": Ints.of_optional([r[2] for r in rows]), "op": Texts.of([r[3] for r in rows]),
        "stream": Texts.repeat(None, n), "owner": Texts.repeat(None, n), "component": Texts.repeat("allocator", n),
        "alloc_total": Ints.absent(n),
    })
    return Profile(path="p", format="kineto", rank="0", devices=(DeviceModel(device="cpu", blocks=blocks),),
                   metadata=dict(metadata))


def test_left_counts_what_was_allocated_in_the_window_and_never_freed() -> None:
    profile = _profile([
        (100, 10, 20, "aten::mm"),  # freed: not left
        (N, 30, None, "aten::empty"),  # left
        (7, 40, None, "aten::add"),  # left
        (5000, None, None, "aten::ones"),  # allocated before the window: not the test's
        (64, None, 50, "aten::zeros"),  # allocated before, freed inside
    ])
    [left] = left_behind(profile)
    assert (left.device, left.bytes, left.count) == ("cpu", N + 7, 2)
    assert [h["op"] for h in left.holders] == ["aten::empty", "aten::add"]
    assert left.summary("t::x") == {"test": "t::x", "device": "cpu", "bytes": N + 7, "count": 2,
                                    "largest": {"size": N, "what": "aten::empty"}}


def test_left_allocated_fails_one_byte_under_and_passes_at_the_exact_value() -> None:
    cache = MetricCache(_profile([(N, 30, None, "aten::empty")]))
    over = judge(cache, budget_from_mapping({"left_allocated": N - 1}, origin="t", default_name="t"), "left_allocated")
    assert not over.passed and over.value == N
    assert over.message.startswith("left_allocated 292.98 KiB exceeds budget 292.97 KiB by 1 B")
    assert "1 block(s) still allocated at the end of the window" in over.message
    # the blocks left come first, under their own heading; the holders at the peak after them
    assert over.detail().splitlines()[0] == "left allocated at the end of the window (cpu): 1 block(s) = 292.98 KiB:"
    assert "aten::empty" in over.detail()
    assert judge(cache, budget_from_mapping({"left_allocated": N}, origin="t", default_name="t"),
                 "left_allocated").passed


def test_left_allocated_is_not_measurable_where_the_loader_says_leaked_is_not() -> None:
    """The loader's word on the history decides, even where blocks look allocated and never freed."""
    why = "its history is cut"
    for metadata in ({"not_measurable": {"leaked_bytes": why}},
                     {"not_measurable_by_device": {"cpu": {"leaked_bytes": why}}}):
        cache = MetricCache(_profile([(N, 30, None, "aten::empty")], **metadata))
        with pytest.raises(NotMeasurable) as caught:
            judge(cache, _LEFT, "left_allocated")
        assert caught.value.message == f"left_allocated is not measurable: cpu: {why}"
    # another device's cut history is not this one's
    cache = MetricCache(_profile([(N, 30, None, "aten::empty")], not_measurable_by_device={"cuda:0": {"leaked_bytes": why}}))
    assert judge(cache, _LEFT, "left_allocated").value == N
    with pytest.raises(NotMeasurable, match="no per-block data"):
        judge(MetricCache(_profile([])), budget_from_mapping({"left_allocated": 0}, origin="t", default_name="t"),
              "left_allocated")


# ---- an incomplete history: not measurable wherever leaked is, for its reason ----------------------

NO_HISTORY = SAMPLES / "torch" / "snapshot_multidevice_expandable_notrace.pickle"
WITHOUT_ADDR = SAMPLES / "torch" / "kineto_torch19_resnet50_cuda_workers4.pt.trace.json.gz"
LEAK_SNAPSHOT = SAMPLES / "torch_cuda" / "h200_snapshot_leak" / "snapshot.pickle"


def _judged(path: Path, metric: str) -> str:
    """The message of ``metric`` judged on the one profile at ``path``: its verdict, or why it is not measurable."""
    [found] = discover(path)
    try:
        return judge(MetricCache(load(found)), _LEFT, metric).message
    except NotMeasurable as exc:
        return exc.message


@pytest.mark.parametrize(("sample", "why"), [
    ("no history", "cuda:0: the snapshot has no allocation history (device_traces hold no allocation or free)"),
    ("ring buffer filled", ("cuda:0: cuda:0: 1 free_completed entry without the free_requested before it: the "
                            "history's ring buffer filled and dropped its oldest entries")),
    ("no Addr", "cpu: its [memory] events carry no Addr (torch 1.9 writes only Bytes"),
])
def test_left_allocated_is_not_measurable_wherever_leaked_is_with_its_reason(sample: str, why: str,
                                                                             tmp_path: Path) -> None:
    """A snapshot without history read "0 B pass" (its blocks at the dump have no allocation time), one whose
    ring buffer filled "19.00 MiB pass" (what was allocated before the cut was gone): both are not measurable,
    with leaked's words, as a Kineto trace without Addr is."""
    path = {"no history": NO_HISTORY, "no Addr": WITHOUT_ADDR}.get(sample, tmp_path / "cut.pickle")
    if sample == "ring buffer filled":
        ring_buffer_cut(LEAK_SNAPSHOT, path)
    left, leaked = _judged(path, "left_allocated"), _judged(path, "leaked")
    assert left.startswith(f"left_allocated is not measurable: {why}")
    assert left.removeprefix("left_allocated") == leaked.removeprefix("leaked")


def test_the_whole_history_of_the_same_snapshot_measures_what_it_left() -> None:
    assert _judged(LEAK_SNAPSHOT, "left_allocated").startswith("left_allocated ")
    assert " is not measurable" not in _judged(LEAK_SNAPSHOT, "left_allocated")


def test_a_marker_on_a_snapshot_without_history_is_an_error_not_a_pass(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_left=f"""
        import pytest

        @pytest.mark.memgate(profile={str(NO_HISTORY)!r}, left_allocated="1 GiB")
        def test_left():
            pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "-rA")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*left_allocated is not measurable: cuda:0: the snapshot has no allocation history*"])
    result.stdout.no_fnmatch_line("*0 B*pass*")


def test_left_allocated_takes_a_size_and_no_percentage() -> None:
    assert budget_from_mapping({"left_allocated": "0 B"}, origin="t", default_name="t").checks() == ["left_allocated"]
    with pytest.raises(ConfigError, match="left_allocated"):
        budget_from_mapping({"left_allocated": "50%"}, origin="t", default_name="t")


def test_the_summary_names_the_tests_that_left_memory_largest_first() -> None:
    left = [{"test": "a::small", "device": "cpu", "bytes": 10, "count": 1, "largest": {"size": 10, "what": "aten::add"}},
            {"test": "a::clean", "device": "cpu", "bytes": 0, "count": 0, "largest": None},
            {"test": "a::big", "device": "cuda:0", "bytes": 1 << 30, "count": 2,
             "largest": {"size": 1 << 29, "what": "aten::empty, Net_0/Linear_0"}}]
    assert left_lines(left) == [
        "    1.00 GiB  cuda:0  a::big  (2 block(s); largest 512.00 MiB aten::empty, Net_0/Linear_0)",
        "        10 B  cpu  a::small  (1 block(s); largest 10 B aten::add)",
    ]
    assert left_lines(left[1:2]) == ["no recorded test left memory allocated (1 test(s) recorded)"]


# ---- real torch, real pytest ----------------------------------------------------------------------

TESTS = f"""
import pytest
import torch
import torch.nn as nn

N = {N}
KEEP = []  # outlives every test: what a test appends here is left behind


def keep(n):
    KEEP.append(torch.empty(n, dtype=torch.uint8))


@pytest.mark.memgate(left_allocated="0 B")
def test_keeps_n(memgate_record):
    keep(N)
    scratch = torch.ones(4096)  # freed when the test returns: not left
    memgate_record.step()


@pytest.mark.memgate(left_allocated=N)
def test_keeps_n_allowed(memgate_record):
    keep(N)
    memgate_record.step()


@pytest.mark.memgate(left_allocated="0 B")
def test_clean(memgate_record):
    x = torch.randn(1000)
    (x * 2).sum()
    memgate_record.step()


# Linear(61, 127) and Linear(127, 11): 9282 float32 parameters, 37128 bytes; AdamW keeps exp_avg and
# exp_avg_sq like each of the 4 parameters and a 4-byte step tensor each: 2 * 37128 + 4 * 4 bytes.
STATE = 2 * 37128 + 4 * 4


def train(memgate_record):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(61, 127), nn.ReLU(), nn.Linear(127, 11))
    opt = torch.optim.AdamW(model.parameters())
    memgate_record.track(model, opt)
    x, y = torch.randn(33, 61), torch.randint(0, 11, (33,))
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        memgate_record.step()


@pytest.mark.memgate(category_caps={{"optimizer_state": STATE - 1, "parameters": 37128}})
def test_state_one_byte_over(memgate_record):
    train(memgate_record)


@pytest.mark.memgate(category_caps={{"optimizer_state": STATE, "gradients": 37128}}, left_allocated="0 B")
def test_state_at_its_exact_bytes(memgate_record):
    train(memgate_record)
"""


def test_a_test_that_keeps_n_bytes_fails_left_allocated_0_and_passes_at_n(pytester: pytest.Pytester) -> None:
    skip_without_torch()
    pytester.makepyfile(test_left=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "-rA",
                                           "--memgate-report-left")
    result.assert_outcomes(failed=2, passed=3)
    result.stdout.fnmatch_lines([
        ("*left_allocated 292.98 KiB exceeds budget 0 B by 292.98 KiB — rank 0 cpu, 1 block(s) still allocated "
        "at the end of the window*"),
        "*left allocated at the end of the window (cpu): 1 block(s) = 292.98 KiB:",
        "*292.98 KiB  aten::empty  owner keep (test_left.py:10)",  # the line that allocated it
        "*in keep (test_left.py:10) <- test_keeps_n (test_left.py:15)",
    ])
    result.stdout.fnmatch_lines([
        ("*category_caps?optimizer_state? 72.53 KiB exceeds budget 72.53 KiB by 1 B (+0.0%) — rank 0 cpu, "
        "optimizer_state at the peak, step 0*"),
        ("*at the peak by category (cpu): parameters 36.26 KiB, buffers 0 B, gradients 36.26 KiB, "
        "optimizer_state 72.53 KiB, *"),
    ])
    for passed in ("test_keeps_n_allowed", "test_clean", "test_state_at_its_exact_bytes"):
        result.stdout.fnmatch_lines([f"PASSED test_left.py::{passed}*"])
    # the session-wide report: the two tests that kept N bytes, none of the others
    result.stdout.fnmatch_lines([
        "*memgate: memory left allocated by tests*",
        "  292.98 KiB  cpu  test_left.py::test_keeps_n  (1 block(s); largest 292.98 KiB aten::empty*",
        "  292.98 KiB  cpu  test_left.py::test_keeps_n_allowed  (1 block(s); largest 292.98 KiB aten::empty*",
    ])
    section = result.stdout.str().split("memory left allocated by tests", 1)[1].split("short test summary", 1)[0]
    assert "test_clean" not in section and "test_state" not in section
    result.stdout.no_fnmatch_line("*INTERNALERROR*")
