"""Ground truth with real torch: CPU training loops with known memory behaviour, recorded by
torch.profiler (profile_memory=True), and the leak / growth metrics memgate reads from them.

Every expected value is derived from how the loop was built (tests/torchloops.py) and the metric
definitions of docs/design.md, never from memgate's output:

- counted steps = the ProfilerStep#N of the trace in step order minus the first ``warmup_steps``;
  iteration ``i`` of a loop is ProfilerStep#i, and the trace holds ``Loop.active_iterations``.
- ``leaked_bytes``: blocks allocated in a counted step other than the last ``leak_horizon_steps``
  ones and never freed in the window; ``leak_undetermined_bytes``: blocks of those last steps
  still live at the end. Fewer than horizon + 1 counted steps: not measurable.
- ``step_growth_bytes``: floors per counted step, P = suffix minimum, w = (n - 1) // 2,
  growth = min_i (P[i+w] - P[i]) // w; fewer than 5 counted steps: not measurable.

What is live at the end of the window, by construction (the last active iteration is L):
- the last iteration's output (BATCH x CLASSES float32) and loss (a 0-dim float32): rebinding
  ``out`` / ``loss`` frees the previous ones inside the next iteration, so only L's survive;
- the last iteration's gradients (one per parameter, like it): ``zero_grad(set_to_none=True)``
  frees them in the next iteration, after the window (grad accumulation: see its cases);
- planted buffers never dropped, optimizer state created inside the window.
Momentum buffers are created in iteration 0, before the window: not in the trace at all.

Growth tolerance: none. The CPU allocator reports each block's exact requested size (a planted
``torch.empty(n, dtype=torch.uint8)`` is an event of exactly n bytes), every iteration allocates
and frees the same tensors in the same order (one thread, fixed batch), and each recording runs in
a fresh process, so the per-step floors are exact integers and repeat bit for bit run to run
(checked: 5 runs of 3 patterns gave identical floors and event counts); the estimator is integer
arithmetic on them. A drift of even one byte would be a real change worth failing on.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from functools import cache
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torchloops as tl
from torchloops import Loop, memory_events, raw_trace, step_spans

from memgate.budgets import budget_from_mapping
from memgate.discover import discover, load
from memgate.judge import judge
from memgate.metric_cache import MetricCache
from memgate.metrics import DeviceMetrics, MetricOptions, grown_blocks, profile_metrics
from memgate.model import Profile
from memgate.sizes import format_size

N = tl.N_BYTES  # 300_007: one planted buffer
PARAMS = tl.param_bytes()  # 37_128: all parameters = all gradients (float32)
OUT_LOSS = tl.BATCH * tl.CLASSES * 4 + 4  # 1_456: the last iteration's output and loss
LAST = PARAMS + OUT_LOSS  # 38_584: what the last iteration leaves live (gradients, output, loss)
ADAM = tl.adam_state_bytes()  # 74_272: exp_avg + exp_avg_sq per parameter + 4-byte step tensors

# name -> loop. Default schedule wait=1, warmup=1, active=6: ProfilerStep#2..#7, counted #3..#7.
LOOPS: dict[str, Loop] = {
    "none": Loop("none"),
    "leak": Loop("leak"),
    "leak_wait0": Loop("leak", wait=0, warmup=1),  # #1..#6
    "leak_wait3_warmup2": Loop("leak", wait=3, warmup=2),  # #5..#10
    "every_other_7": Loop("leak_every_other", active=8),  # #2..#9: 7 counted, w = 3
    "every_other_9": Loop("leak_every_other", active=10),  # #2..#11: 9 counted, w = 4
    "hold3": Loop("hold", hold_steps=3, active=8),  # #2..#9
    "adam_at3": Loop("adam_lazy", first_opt_step=3, active=8),  # state created in #3 (first counted)
    "adam_at2": Loop("adam_lazy", first_opt_step=2, active=8),  # state created in #2 (the warmup step)
    "cache": Loop("cache", cache_iterations=(3, 4), active=8),  # filled in #3, #4
    "accum2": Loop("grad_accum", accum_steps=2, optimizer="sgd_plain", active=8),  # #9 closes a cycle
    "accum3_cut": Loop("grad_accum", accum_steps=3, optimizer="sgd_plain", active=6),  # #7: mid-cycle
    "leak_active5": Loop("leak", active=5),  # 4 counted: too few for growth
    "leak_active3": Loop("leak", active=3),  # 2 counted
    "leak_active2": Loop("leak", active=2),  # 1 counted
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """All loops recorded once, each in a fresh process (see torchloops.record_isolated)."""
    out = tmp_path_factory.mktemp("torchloops")
    paths = {name: out / f"{name}.pt.trace.json" for name in LOOPS}
    tl.record_isolated([(paths[name], loop) for name, loop in LOOPS.items()])
    _profile.cache_clear()
    return paths


@cache
def _profile(path: Path) -> Profile:
    [found] = discover(path)
    return load(found)


def metrics(path: Path, warmup_steps: int = 1, leak_horizon_steps: int = 1) -> DeviceMetrics:
    [m] = profile_metrics(_profile(path), MetricOptions(warmup_steps=warmup_steps,
                                                        leak_horizon_steps=leak_horizon_steps))
    assert m.device == "cpu"
    return m


# ---------------------------------------------------------------------------------------------
# The recordings are what the loops did (checked on the raw JSON, without memgate)




@pytest.mark.parametrize("name", list(LOOPS))
def test_recording_holds_the_loop(traces: dict[str, Path], name: str) -> None:
    loop = LOOPS[name]
    trace = raw_trace(traces[name])
    steps = step_spans(trace)
    assert sorted(steps) == loop.active_iterations
    mem = memory_events(trace)
    assert mem, "profile_memory=True wrote no [memory] events"
    # A fresh process: the reporter's running total starts at 0 at the window (allocations of the
    # wait/warmup iterations are not tracked), and it is the exact running sum of the events.
    total = 0
    for e in mem:
        total += e["args"]["Bytes"]
        assert e["args"]["Total Allocated"] == total
        assert e["args"]["Device Type"] == 0 and e["args"]["Total Reserved"] == 0
    # Every allocation and free falls inside a ProfilerStep span.
    assert all(any(a <= Decimal(e["ts"]) <= b for a, b in steps.values()) for e in mem)
    # Each planted buffer is one event of exactly n_bytes inside its iteration's step.
    for i, size in tl.planted(loop).items():
        if i in steps:
            a, b = steps[i]
            assert [e["args"]["Bytes"] for e in mem if a <= Decimal(e["ts"]) <= b
                    and e["args"]["Bytes"] == size] == [size]
    # Frees are reported only for blocks allocated in the window: every free has its allocation.
    live: set[int] = set()
    for e in mem:
        if e["args"]["Bytes"] > 0:
            live.add(e["args"]["Addr"])
        else:
            live.remove(e["args"]["Addr"])


# ---------------------------------------------------------------------------------------------
# leaked_bytes and leak_undetermined_bytes, exact

LEAK_CASES = [
    # name, warmup_steps, leak_horizon_steps, leaked, undetermined
    # no leak: the last step's gradients/output/loss are freed only after the window -> horizon.
    ("none", 1, 1, 0, LAST),
    ("none", 0, 1, 0, LAST),  # counting #2 too: its tensors are freed in #3
    # a buffer per step, kept: counted #3..#7, #7 is the horizon -> #3..#6 leak.
    ("leak", 1, 1, 4 * N, N + LAST),
    ("leak", 1, 2, 3 * N, 2 * N + LAST),
    ("leak", 0, 1, 5 * N, N + LAST),  # #2 counted as well
    ("leak_wait0", 1, 1, 4 * N, N + LAST),  # #1..#6: counted #2..#6
    ("leak_wait3_warmup2", 1, 1, 4 * N, N + LAST),  # #5..#10: counted #6..#10
    # even iterations only: counted #3..#9 (#9 horizon) -> #4, #6, #8.
    ("every_other_7", 1, 1, 3 * N, LAST),
    # counted #3..#11 (#11 horizon) -> #4, #6, #8, #10.
    ("every_other_9", 1, 1, 4 * N, LAST),
    # deque(maxlen=3): the buffer of #i is freed in #i+3; those of #7, #8, #9 outlive the window (L=9).
    # Horizon 1 reports #7 and #8 as leaked (they had only 2 and 1 steps to be freed); horizon 3 = k
    # gives every buffer its full life and nothing is leaked.
    ("hold3", 1, 1, 2 * N, N + LAST),
    ("hold3", 1, 2, N, 2 * N + LAST),
    ("hold3", 1, 3, 0, 3 * N + LAST),
    # Adam's state is created by its first opt.step(), in #3, a counted step that is not the last,
    # and never freed: it IS counted (the definition cannot tell lazily created state from a leak).
    ("adam_at3", 1, 1, ADAM, LAST),
    ("adam_at3", 0, 1, ADAM, LAST),
    # Created in #2: the warmup step hides it; counting #2 (warmup_steps=0) shows it.
    ("adam_at2", 1, 1, 0, LAST),
    ("adam_at2", 0, 1, ADAM, LAST),
    # filled in #3 and #4, then kept.
    ("cache", 1, 1, 2 * N, LAST),
    # grad accumulation, 2 per cycle, zero_grad at the end of #1, #3, ..., #9: the window ends on
    # a cycle's end, so the gradients are freed inside it; only #9's output and loss are left.
    ("accum2", 1, 1, 0, OUT_LOSS),
    # 3 per cycle, cycles #0-#2, #3-#5, #6-#8; the window ends at #7, inside the last cycle: the
    # gradients allocated by #6's backward are still live. Horizon 1: #6 is decided -> leaked;
    # horizon 2 covers #6 and #7 -> undetermined. (A cut cycle needs horizon >= its position.)
    ("accum3_cut", 1, 1, PARAMS, OUT_LOSS),
    ("accum3_cut", 1, 2, 0, PARAMS + OUT_LOSS),
    # 5 active steps: 4 counted (#3..#6), enough for leaks (not for growth).
    ("leak_active5", 1, 1, 3 * N, N + LAST),
    # 3 active steps: 2 counted (#3, #4) = horizon 1 + 1, the minimum.
    ("leak_active3", 1, 1, N, N + LAST),
]


@pytest.mark.parametrize(("name", "warmup", "horizon", "leaked", "undetermined"), LEAK_CASES,
                         ids=[f"{c[0]}-warmup{c[1]}-horizon{c[2]}" for c in LEAK_CASES])
def test_leaked_bytes(traces: dict[str, Path], name: str, warmup: int, horizon: int, leaked: int,
                      undetermined: int) -> None:
    m = metrics(traces[name], warmup, horizon)
    assert "leaked_bytes" not in m.missing and "leak_undetermined_bytes" not in m.missing, m.missing
    assert m.values["leaked_bytes"] == leaked
    assert m.values["leak_undetermined_bytes"] == undetermined


@pytest.mark.parametrize(("name", "warmup", "horizon", "leaked", "undetermined"), LEAK_CASES,
                         ids=[f"{c[0]}-warmup{c[1]}-horizon{c[2]}" for c in LEAK_CASES])
def test_the_blocks_a_leak_failure_shows_are_the_blocks_it_counts(
        traces: dict[str, Path], name: str, warmup: int, horizon: int, leaked: int, undetermined: int) -> None:
    """A failed leaked / step_growth check leads with the blocks it is about: exactly those leaked_bytes
    (and, for growth, leak_undetermined_bytes) count, by construction of the loop."""
    profile = _profile(traces[name])
    options = MetricOptions(warmup_steps=warmup, leak_horizon_steps=horizon)
    [device] = profile.devices
    decided = grown_blocks(profile, device, options, undetermined=False)
    both = grown_blocks(profile, device, options, undetermined=True)
    assert decided is not None and both is not None
    assert decided.total == leaked and both.total == leaked + undetermined
    if name in ("leak", "leak_active5", "leak_active3"):  # one planted buffer of N bytes per decided step
        assert decided.count == leaked // N and all(h["size"] == N for h in decided.holders)


def test_a_leak_failure_leads_with_the_planted_buffers(traces: dict[str, Path]) -> None:
    """The failure's first evidence is the leak, count × size, above the holders at the peak."""
    cache = MetricCache(_profile(traces["leak"]))
    assert LOOPS["leak"].active_iterations == [2, 3, 4, 5, 6, 7]  # counted #3..#7; horizon 1: #3..#6 decided
    outcome = judge(cache, budget_from_mapping({"leaked": 0}, origin="t", default_name="t"), "leaked")
    lines = outcome.detail().splitlines()
    assert lines[0] == ("leaked: allocated in steps 3–6 and still allocated when step 7 ended (cpu): "
                        f"4 block(s) = {format_size(4 * N)}:")
    assert lines[1].startswith(f"  4 × {format_size(N)} = {format_size(4 * N)}  aten::empty")
    assert any(line.startswith("top ") and "live blocks at the peak" in line for line in lines[2:])


def test_held_buffer_is_a_leak_only_within_a_short_horizon(traces: dict[str, Path]) -> None:
    """The buffer kept k=3 steps: horizon 1 calls it leaked, horizon k does not; the bytes move to
    leak_undetermined, the live total of the last counted steps' blocks stays the same."""
    h1, hk = metrics(traces["hold3"], 1, 1), metrics(traces["hold3"], 1, 3)
    assert h1.values["leaked_bytes"] == 2 * N and hk.values["leaked_bytes"] == 0
    assert (h1.values["leaked_bytes"] + h1.values["leak_undetermined_bytes"]
            == hk.values["leaked_bytes"] + hk.values["leak_undetermined_bytes"] == 3 * N + LAST)


# ---------------------------------------------------------------------------------------------
# step_growth_bytes, exact (see the module docstring for why no tolerance)

GROWTH_CASES = [
    # name, warmup_steps, growth
    ("none", 1, 0),
    ("none", 0, 0),  # #2's floor is low (frees of warmup blocks are not reported): one early jump
    ("leak", 1, N),  # 5 counted, w = 2: each floor N above the last
    ("leak", 0, N),  # 6 counted, w = 2: the #2 -> #3 jump (N plus the first-step artefact) is one interval
    ("leak_wait0", 1, N),
    ("leak_wait3_warmup2", 1, N),
    # every other step, w = 3: any 3 consecutive intervals hold 1 or 2 leaks -> min (1 * N) // 3
    ("every_other_7", 1, (3 // 2) * N // 3),  # 100_002
    # w = 4: always exactly 2 leaks per 4 intervals -> (2 * N) // 4 = N // 2
    ("every_other_9", 1, N // 2),  # 150_003
    # held 3 steps: the level climbs while the deque's pre-window buffers (whose frees are not
    # reported) are replaced by in-window ones (#2..#4), then is flat: runs from #4 on read 0.
    ("hold3", 1, 0),
    ("adam_at3", 1, 0),  # one jump (the state) after #3, flat after
    ("adam_at2", 0, 0),
    ("cache", 1, 0),  # two jumps (#3, #4), flat from #5
    ("accum2", 1, 0),  # periodic floors
    ("accum3_cut", 1, 0),  # periodic; the suffix minimum rises only at the last step
]


@pytest.mark.parametrize(("name", "warmup", "growth"), GROWTH_CASES,
                         ids=[f"{c[0]}-warmup{c[1]}" for c in GROWTH_CASES])
def test_step_growth_bytes(traces: dict[str, Path], name: str, warmup: int, growth: int) -> None:
    m = metrics(traces[name], warmup)
    assert "step_growth_bytes" not in m.missing, m.missing
    assert m.values["step_growth_bytes"] == growth


def test_every_other_step_leak_reads_half_for_even_w(traces: dict[str, Path]) -> None:
    assert metrics(traces["every_other_9"]).values["step_growth_bytes"] == N // 2
    assert metrics(traces["every_other_7"]).values["step_growth_bytes"] == N // 3  # floor(w/2) * N // w, w = 3


# ---------------------------------------------------------------------------------------------
# Not measurable: the reason names what to record


def _says_how_many_steps(reason: str, counted_needed: int, warmup: int) -> None:
    """The reason mentions steps and the number needed (counted, or active = counted + warmup)."""
    assert "step" in reason.lower(), reason
    numbers = {int(n) for n in re.findall(r"\d+", reason)}
    assert numbers & {counted_needed, counted_needed + warmup}, reason


def test_growth_not_measurable_with_4_counted_steps(traces: dict[str, Path]) -> None:
    m = metrics(traces["leak_active5"])
    assert m.values["step_growth_bytes"] is None
    _says_how_many_steps(m.missing["step_growth_bytes"], 5, 1)
    assert m.values["leaked_bytes"] == 3 * N  # the leaks are measurable with 4 counted steps


def test_growth_measurable_from_5_counted_steps(traces: dict[str, Path]) -> None:
    """wait=1, warmup=1, active=6: 6 active steps, 5 counted (warmup_steps=1): the minimum."""
    assert metrics(traces["leak"]).values["step_growth_bytes"] == N
    m = metrics(traces["leak"], warmup_steps=2)  # 4 counted
    assert m.values["step_growth_bytes"] is None
    _says_how_many_steps(m.missing["step_growth_bytes"], 5, 2)


def test_leaks_not_measurable_below_horizon_plus_one(traces: dict[str, Path]) -> None:
    m = metrics(traces["leak_active2"])  # 1 counted step, horizon 1
    assert m.values["leaked_bytes"] is None and m.values["leak_undetermined_bytes"] is None
    _says_how_many_steps(m.missing["leaked_bytes"], 2, 1)
    m = metrics(traces["leak_active3"], 1, 2)  # 2 counted steps, horizon 2
    assert m.values["leaked_bytes"] is None
    _says_how_many_steps(m.missing["leaked_bytes"], 3, 1)
    assert metrics(traces["leak_active3"], 1, 1).values["leaked_bytes"] == N  # horizon 1: measurable


# ---------------------------------------------------------------------------------------------
# The committed samples (tests/data/samples/torch/PROVENANCE.md): model 64 -> 128 -> 10, batch 32

SAMPLES = Path(__file__).parent / "data" / "samples" / "torch"
SAMPLE_LEAK = 256 * 1024  # 262_144 B kept per step
# the last step's gradients (64*128 + 128 + 128*10 + 10 floats), output (32 x 10 floats), loss
SAMPLE_LAST = 4 * (64 * 128 + 128 + 128 * 10 + 10) + 4 * 32 * 10 + 4  # 39_724


def _sample_metrics(name: str) -> DeviceMetrics:
    return metrics(SAMPLES / name)


def test_old_clean_sample_leaks_nothing() -> None:
    """3 active steps (#2..#4): counted #3, #4; #4 is the horizon."""
    m = _sample_metrics("cpu_train_profile_memory.json")
    assert m.values["leaked_bytes"] == 0
    assert m.values["leak_undetermined_bytes"] == SAMPLE_LAST
    _says_how_many_steps(m.missing["step_growth_bytes"], 5, 1)  # 2 counted steps


def test_old_leak_sample_leaks_one_step() -> None:
    """262144 x (2 counted - 1 horizon)."""
    m = _sample_metrics("cpu_train_leak_profile_memory.json")
    assert m.values["leaked_bytes"] == SAMPLE_LEAK * (2 - 1)
    assert m.values["leak_undetermined_bytes"] == SAMPLE_LEAK + SAMPLE_LAST


def test_new_clean_sample() -> None:
    """6 active steps (#2..#7), 5 counted. Growth exact: the floors of #3..#7 are equal to the byte
    (the same tensors every step), so the estimator's integer result is 0."""
    m = _sample_metrics("cpu_train_active6_profile_memory.json")
    assert m.values["leaked_bytes"] == 0
    assert m.values["leak_undetermined_bytes"] == SAMPLE_LAST
    assert m.values["step_growth_bytes"] == 0


def test_new_leak_sample() -> None:
    """262144 x (5 counted - 1 horizon) leaked; growth exactly 262144: each step's floor is the
    previous one plus the one kept buffer (nothing else changes between steps)."""
    m = _sample_metrics("cpu_train_active6_leak_profile_memory.json")
    assert m.values["leaked_bytes"] == SAMPLE_LEAK * 4
    assert m.values["leak_undetermined_bytes"] == SAMPLE_LEAK + SAMPLE_LAST
    assert m.values["step_growth_bytes"] == SAMPLE_LEAK


@pytest.mark.parametrize("name", ["cpu_train_active6_profile_memory.json",
                                  "cpu_train_active6_leak_profile_memory.json"])
def test_new_samples_as_provenance_says(name: str) -> None:
    text = (SAMPLES / name).read_text()
    trace = json.loads(text, parse_float=Decimal)
    assert trace["traceName"] == name
    assert sorted(step_spans(trace)) == [2, 3, 4, 5, 6, 7]
    mem = memory_events(trace)
    first = mem[0]["args"]
    assert first["Total Allocated"] == first["Bytes"]  # recorded in a process of its own
    leaks = [e for e in mem if e["args"]["Bytes"] == SAMPLE_LEAK]
    assert len(leaks) == (6 if "leak" in name else 0)
