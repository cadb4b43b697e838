"""Categories at the peak (parameters, buffers, gradients, optimizer_state, activations, other), exact by
address and lifetime: ground truth from real torch on CPU, and the attribution rules on blocks built by
hand (a CUDA snapshot's path, which no GPU here records).

The expected bytes come from the model and the optimizer themselves, read after the run by each
tensor's own storage (``t.untyped_storage().nbytes()``), never from memgate's output.
"""

from __future__ import annotations

import json
import pickle
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from helpers import NEEDS_TORCH

from memgate import categories
from memgate.budgets import budget_from_mapping
from memgate.categories import CATEGORIES, Tracked, attribute
from memgate.compare import attribution_lines, grown_at_peak
from memgate.discover import discover, load
from memgate.errors import ConfigError, InputError, NotMeasurable
from memgate.judge import judge
from memgate.metric_cache import MetricCache
from memgate.model import DeviceModel
from memgate.record import RECORDING_MANIFEST, record
from memgate.report import profile_entry
from memgate.suggest import suggest_toml
from memgate.table import Ints, Table, Texts

# Odd sizes (no tensor a multiple of 512 bytes); BatchNorm1d brings buffers (running stats and the
# int64 num_batches_tracked).
IN, HIDDEN, OUT, BATCH, STEPS = 61, 127, 11, 33, 3


def _train(directory: Path, *, track_optimizer: bool = True) -> tuple[Any, Any]:
    """A tracked AdamW training loop, model and optimizer built inside the recording; returns them."""
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    nn = torch.nn
    torch.manual_seed(0)
    with record(directory) as rec:
        model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.BatchNorm1d(HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        rec.track(model, opt) if track_optimizer else rec.track(model)
        x, y = torch.randn(BATCH, IN), torch.randint(0, OUT, (BATCH,))
        for _ in range(STEPS):
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            rec.step()
    return model, opt


def _storage_bytes(tensors: Any) -> int:
    """Bytes of the distinct storages of ``tensors``, each by its own nbytes."""
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


def _state_tensors(opt: Any) -> list[Any]:
    import torch

    return [v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def _measured(directory: Path) -> tuple[MetricCache, Any]:
    [found] = discover(directory)
    cache = MetricCache(load(found))
    [device] = cache.get()
    return cache, device


@pytest.fixture(scope="module")
def tracked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    directory = tmp_path_factory.mktemp("tracked") / "prof"
    model, opt = _train(directory)
    return directory, model, opt


def test_a_tracked_adamw_step_is_exact_to_the_byte(tracked: tuple[Path, Any, Any]) -> None:
    directory, model, opt = tracked
    params = list(model.parameters())
    parameters = _storage_bytes(params)
    assert parameters == sum(p.numel() * p.element_size() for p in params)  # 38_144 B, by the shapes
    gradients = _storage_bytes(p.grad for p in params)
    buffers = _storage_bytes(model.buffers())  # running_mean, running_var (float32), num_batches_tracked (int64)
    assert buffers == 2 * HIDDEN * 4 + 8
    state = _state_tensors(opt)
    optimizer_state = _storage_bytes(state)
    # what torch really allocates for AdamW on CPU: exp_avg and exp_avg_sq like each parameter, and a
    # 0-dim float32 `step` tensor per parameter
    assert optimizer_state == 2 * parameters + 4 * len(params)
    assert len(state) == 3 * len(params)

    cache, device = _measured(directory)
    assert cache.info.format == "torch_recording"
    at_peak = device.values["category_bytes_at_peak"]
    assert list(at_peak) == list(CATEGORIES)
    assert at_peak["parameters"] == parameters
    assert at_peak["buffers"] == buffers
    assert at_peak["gradients"] == gradients
    assert at_peak["optimizer_state"] == optimizer_state
    assert at_peak["other"] == 0  # everything was allocated inside the recording's steps or tracked
    # the categories split the blocks live at the peak, which add up to the (window-relative) peak
    assert sum(at_peak.values()) == device.values["peak_allocated_bytes"]
    assert "category_bytes_at_peak" not in device.missing


@pytest.mark.parametrize("category", ["parameters", "buffers", "gradients", "optimizer_state"])
def test_category_caps_fail_one_byte_under_and_pass_at_the_exact_value(
        tracked: tuple[Path, Any, Any], category: str) -> None:
    directory, _, _ = tracked
    cache, device = _measured(directory)
    exact = device.values["category_bytes_at_peak"][category]
    over = judge(cache, budget_from_mapping({"category_caps": {category: exact - 1}}, origin="t", default_name="t"),
                 f"category_caps[{category}]")
    assert not over.passed and over.value == exact and over.limit == exact - 1
    assert over.message.startswith(f"category_caps[{category}] ")
    assert "exceeds budget" in over.message and f"{category} at the peak" in over.message
    assert f"{category} " in over.detail().splitlines()[0]  # the failure detail: the peak by category
    at = judge(cache, budget_from_mapping({"category_caps": {category: exact}}, origin="t", default_name="t"),
               f"category_caps[{category}]")
    assert at.passed and at.value == exact


def test_a_failed_peak_shows_the_peak_by_category_and_the_holders_category(tracked: tuple[Path, Any, Any]) -> None:
    directory, _, _ = tracked
    cache, _ = _measured(directory)
    outcome = judge(cache, budget_from_mapping({"peak_allocated": 1}, origin="t", default_name="t"), "peak_allocated")
    detail = outcome.detail()
    assert detail.splitlines()[0].startswith("at the peak by category (cpu): parameters ")
    assert all(h.get("category") in CATEGORIES for h in outcome.holders)


def test_an_untracked_optimizers_state_counts_as_activations(tmp_path: Path,
                                                             tracked: tuple[Path, Any, Any]) -> None:
    """Only the model tracked: AdamW's state, created inside step 0, is activations (never
    optimizer_state); the run is the same, so its bytes move from one category to the other exactly."""
    model, opt = _train(tmp_path / "prof", track_optimizer=False)
    _, device = _measured(tmp_path / "prof")
    _, tracked_device = _measured(tracked[0])
    alone, both = device.values["category_bytes_at_peak"], tracked_device.values["category_bytes_at_peak"]
    optimizer_state = _storage_bytes(_state_tensors(opt))
    assert alone["optimizer_state"] == 0
    assert alone["parameters"] == _storage_bytes(model.parameters())
    assert alone["gradients"] == _storage_bytes(p.grad for p in model.parameters())
    assert device.values["peak_allocated_bytes"] == tracked_device.values["peak_allocated_bytes"]
    assert alone["activations"] == both["activations"] + optimizer_state


def test_the_manifest_keeps_a_storage_that_stays_the_same_as_one_row(tracked: tuple[Path, Any, Any]) -> None:
    directory, model, opt = tracked
    manifest = json.loads((directory / RECORDING_MANIFEST).read_text())
    moments = manifest["tracked"]["moments"]
    # a step end per step, the optimizer's step start and end per step, the stop
    assert [m["at"] for m in moments].count("step end") == STEPS
    assert [m["at"] for m in moments].count("optimizer step end") == STEPS
    assert moments[-1]["at"] == "stop"
    rows = manifest["tracked"]["storages"]
    params = [r for r in rows if r[0] == "parameters"]
    assert len(params) == len(list(model.parameters()))  # one row each, however many moments
    assert all((r[4], r[5]) == (0, len(moments) - 1) for r in params)
    state = [r for r in rows if r[0] == "optimizer_state"]
    assert sorted(r[3] for r in state) == sorted(t.untyped_storage().nbytes() for t in _state_tensors(opt))
    trace = json.loads((directory / "torch_trace.json").read_text())
    spans = {e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith(categories.NOTE_PREFIX)}
    assert spans == {f"{categories.NOTE_PREFIX}{k}" for k in range(len(moments))}


def test_an_untracked_recording_reports_no_categories(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    with record(tmp_path / "prof") as rec:
        model = torch.nn.Linear(8, 4)
        for _ in range(2):
            model(torch.randn(3, 8)).sum().backward()
            rec.step()
    assert "tracked" not in json.loads((tmp_path / "prof" / RECORDING_MANIFEST).read_text())
    cache, device = _measured(tmp_path / "prof")
    assert cache.info.format == "kineto"  # as before: the trace alone
    assert "category_bytes_at_peak" not in device.values and "category_bytes_at_peak" not in device.missing
    with pytest.raises(NotMeasurable, match="records no categories"):
        judge(cache, budget_from_mapping({"category_caps": {"activations": "1 GiB"}}, origin="t", default_name="t"),
              "category_caps[activations]")


def test_track_refuses_what_is_no_module_or_optimizer(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    with record(tmp_path / "prof") as rec, pytest.raises(TypeError, match="nn.Module and torch.optim.Optimizer"):
        rec.track("model")
    with pytest.raises(TypeError, match="not str"), record(tmp_path / "other", track=["model"]):
        raise AssertionError("not reached: the recorder refuses before it starts")
    assert not (tmp_path / "other").exists()


# ---- the rules, on blocks built by hand ---------------------------------------------------------

A = 0x7F00_0000_0000


def _device(rows: list[tuple[int, int, int | None, int | None]], label: str = "cuda:0") -> DeviceModel:
    """Blocks of (addr, size, t_alloc, t_free)."""
    n = len(rows)
    blocks = Table({
        "size": Ints.of([r[1] for r in rows]),
        "t_alloc": Ints.of_optional([r[2] for r in rows]),
        "t_free": Ints.of_optional([r[3] for r in rows]),
        "op": Texts.repeat(None, n), "stream": Texts.repeat(None, n), "owner": Texts.repeat(None, n),
        "component": Texts.repeat("allocator", n), "alloc_total": Ints.absent(n),
        "addr": Ints.of([r[0] for r in rows]),
    })
    return DeviceModel(device=label, blocks=blocks)


def _tracked(rows: list[list[Any]], moments: int) -> Tracked:
    return Tracked.of({"moments": [{"at": "step end", "step": 0}] * moments, "storages": rows})


STEPS_TABLE = Table({"step": Ints.of([0, 1]), "t_start": Ints.of([100, 200]), "t_end": Ints.of([199, 299])})


def test_a_block_takes_the_category_of_a_storage_it_held_when_noted() -> None:
    device = _device([
        (A, 4096, None, None),  # 0: live all along (allocated before the window): a parameter
        (A + 4096, 1024, 150, 160),  # 1: freed before the moment, at the address a gradient takes later
        (A + 4096, 1024, 170, None),  # 2: the gradient, at the same address
        (A + 8192, 2048, 180, None),  # 3: optimizer state whose storage starts 512 bytes in
        (A + 16384, 512, 120, 130),  # 4: a temporary of step 0
        (A + 20480, 512, 50, None),  # 5: allocated before the steps
        (A + 24576, 512, 185, None),  # 6: a parameter and a gradient in one block: parameters win
    ])
    tracked = _tracked([
        ["parameters", "cuda:0", A, 4096, 0, 0],
        ["gradients", "cuda:0", A + 4096, 1024, 0, 0],
        ["optimizer_state", "cuda:0", A + 8192 + 512, 1024, 0, 0],
        ["gradients", "cuda:0", A + 24576, 512, 0, 0],
        ["parameters", "cuda:0", A + 24576, 512, 0, 0],
        ["gradients", "cpu", A + 20480, 512, 0, 0],  # another device's storage: not this device's block
    ], moments=1)
    attributed, facts = attribute(device, tracked, {0: 190}, STEPS_TABLE)
    assert attributed.blocks.texts("category").tolist() == [
        "parameters", "activations", "gradients", "optimizer_state", "activations", "other", "parameters"]
    assert facts == {"storage_runs": 5}


def test_a_storage_noted_where_no_block_was_live_is_said() -> None:
    device = _device([(A, 1024, 10, 20)])
    tracked = _tracked([["gradients", "cuda:0", A, 1024, 0, 1]], moments=3)
    # moment 0 is before the block, moment 1 after its free, moment 2 is not in the trace (a warm-up step)
    attributed, facts = attribute(device, tracked, {0: 5, 1: 25}, STEPS_TABLE)
    assert attributed.blocks.texts("category").tolist() == ["other"]
    assert facts == {"storage_runs": 1, "storages_without_block": 1, "bytes_without_block": 1024}
    # the block is live at a moment of the run (the second): a gradient
    attributed, _ = attribute(device, tracked, {0: 5, 1: 15}, STEPS_TABLE)
    assert attributed.blocks.texts("category").tolist() == ["gradients"]


def test_blocks_without_addresses_get_no_categories() -> None:
    device = _device([(A, 1024, 10, 20)])
    plain = DeviceModel(device="cpu", blocks=device.blocks.select(
        ("size", "t_alloc", "t_free", "op", "stream", "owner", "component", "alloc_total")))
    same, facts = attribute(plain, _tracked([], 1), {0: 15}, STEPS_TABLE)
    assert same is plain and "not attributed" in facts


# ---- a CUDA recording: the snapshot's blocks, in the snapshot's clock ------------------------------

MIB = 1 << 20


def _snapshot_recording(directory: Path) -> None:
    """A recording as a GPU run writes it: a CPU-only Kineto trace, a CUDA snapshot whose history and
    annotations are in µs (ProfilerStep#0 from 1000 to 2000 µs, memgate::note#0 at 1900 µs), and a
    manifest that tracked a parameter (allocated before the history), a gradient and optimizer state."""
    directory.mkdir(parents=True)
    seg = A
    entries = [
        {"action": "alloc", "addr": seg + 2 * MIB, "size": MIB, "stream": 0, "time_us": 1100, "frames": []},  # grad
        {"action": "alloc", "addr": seg + 3 * MIB, "size": MIB, "stream": 0, "time_us": 1200, "frames": []},  # state
        {"action": "alloc", "addr": seg + 4 * MIB, "size": 2 * MIB, "stream": 0, "time_us": 1300, "frames": []},  # act
        {"action": "free_requested", "addr": seg + 4 * MIB, "size": 2 * MIB, "stream": 0, "time_us": 1800,
         "frames": []},
        {"action": "free_completed", "addr": seg + 4 * MIB, "size": 2 * MIB, "stream": 0, "time_us": 1800,
         "frames": []},
    ]

    def block(addr: int, size: int, state: str) -> dict[str, Any]:
        return {"address": addr, "size": size, "requested_size": size, "state": state, "frames": []}

    segment = {"device": 0, "address": seg, "total_size": 8 * MIB, "allocated_size": 4 * MIB,
               "active_size": 4 * MIB, "requested_size": 4 * MIB, "stream": 0, "segment_type": "large",
               "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
               "blocks": [block(seg, 2 * MIB, "active_allocated"), block(seg + 2 * MIB, MIB, "active_allocated"),
                          block(seg + 3 * MIB, MIB, "active_allocated"), block(seg + 4 * MIB, 4 * MIB, "inactive")]}
    annotations = [{"name": "ProfilerStep#0", "stage": "START", "device": 0, "time_us": 1000},
                   {"name": "memgate::note#0", "stage": "START", "device": 0, "time_us": 1900},
                   {"name": "memgate::note#0", "stage": "END", "device": 0, "time_us": 1900},
                   {"name": "ProfilerStep#0", "stage": "END", "device": 0, "time_us": 2000}]
    snapshot = {"segments": [segment], "device_traces": [entries], "external_annotations": annotations}
    (directory / "cuda_snapshot.pickle").write_bytes(pickle.dumps(snapshot))
    base = 1_700_000_000_000_000_000
    trace = {"baseTimeNanoseconds": base, "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": "1000.000",
         "dur": "1000.000"},
        {"ph": "X", "cat": "user_annotation", "name": "memgate::note#0", "pid": 1, "tid": 1, "ts": "1900.000",
         "dur": "0.500"},
        {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": "1500.000",
         "args": {"Total Reserved": 0, "Total Allocated": 64, "Bytes": 64, "Device Id": -1, "Device Type": 0,
                  "Addr": 4096}},
    ]}
    (directory / "torch_trace.json").write_text(json.dumps(trace).replace('"1000.000"', "1000.000")
                                                .replace('"1900.000"', "1900.000").replace('"0.500"', "0.500")
                                                .replace('"1500.000"', "1500.000"))
    manifest = {"memgate_recording": 1, "steps": 1, "trace": "torch_trace.json",
                "snapshots": [{"file": "cuda_snapshot.pickle", "device_type": "cuda", "max_entries": 100000}],
                "device_memory": None,
                "tracked": {"modules": 1, "optimizers": 1, "moments": [{"at": "step end", "step": 0}],
                            "columns": ["category", "device", "data_ptr", "nbytes", "first", "last"],
                            "storages": [["parameters", "cuda:0", seg, 2 * MIB, 0, 0],
                                         ["gradients", "cuda:0", seg + 2 * MIB, MIB, 0, 0],
                                         ["optimizer_state", "cuda:0", seg + 3 * MIB, MIB, 0, 0],
                                         ["optimizer_state", "cpu", 4096, 64, 0, 0]]}}
    (directory / RECORDING_MANIFEST).write_text(json.dumps(manifest))


def test_a_cuda_recordings_blocks_are_attributed_in_the_snapshots_clock(tmp_path: Path) -> None:
    _snapshot_recording(tmp_path / "rec")
    [found] = discover(tmp_path / "rec")
    profile = load(found)
    assert profile.format == "torch_recording"
    devices = {d.device: d for d in MetricCache(profile).get()}
    cuda = devices["cuda:0"].values
    # the peak: the parameter (live all along), the gradient, the state and the 2 MiB activation
    assert cuda["peak_allocated_bytes"] == 6 * MIB
    assert cuda["category_bytes_at_peak"] == {"parameters": 2 * MIB, "buffers": 0, "gradients": MIB,
                                              "optimizer_state": MIB, "activations": 2 * MIB, "other": 0}
    # the CPU trace's block is attributed in the trace's clock: the state's step tensor on the CPU
    assert devices["cpu"].values["category_bytes_at_peak"]["optimizer_state"] == 64
    blocks = next(d for d in profile.devices if d.device == "cuda:0").blocks
    assert sorted(blocks.ints("addr").values.tolist()) == [A, A + 2 * MIB, A + 3 * MIB, A + 4 * MIB]


# ---- budgets, comparisons and suggestions ----------------------------------------------------------


def test_category_caps_name_an_unknown_category() -> None:
    with pytest.raises(ConfigError, match=r"unknown category 'optimizer_sate' \(did you mean 'optimizer_state'\?\)"):
        budget_from_mapping({"category_caps": {"optimizer_sate": "1 GiB"}}, origin="t", default_name="t")
    budget = budget_from_mapping({"category_caps": {"activations": "8 GiB", "optimizer_state": "50%"}}, origin="t", default_name="t")
    assert budget.checks() == ["category_caps[activations]", "category_caps[optimizer_state]"]
    assert budget.category_caps["activations"] == 8 << 30 and budget.shares["category_caps[optimizer_state]"] == 0.5


def test_a_comparison_names_the_category_that_grew() -> None:
    before = {"metrics": {"category_bytes_at_peak": {"parameters": 100, "optimizer_state": 200, "activations": 50}}}
    now = {"metrics": {"category_bytes_at_peak": {"parameters": 100, "optimizer_state": 400, "activations": 60}}}
    grew = grown_at_peak(before, now)
    assert [row["name"] for row in grew["categories"]] == ["optimizer_state", "activations"]
    assert attribution_lines(grew)[0] == "grew at the peak: category optimizer_state 200 B -> 400 B (+200 B)"
    assert grown_at_peak({"metrics": {}}, now) == {}  # a baseline without categories compares as before


def test_suggest_proposes_category_caps_from_the_measured_values(tracked: tuple[Path, Any, Any]) -> None:
    directory, _, _ = tracked
    cache, _ = _measured(directory)
    entry = profile_entry(cache.info, cache.get())
    text = suggest_toml([entry], headroom=Decimal(10))
    line = next(line for line in text.splitlines() if line.startswith("category_caps = "))
    assert 'parameters = "1 MiB"' in line and 'optimizer_state = "1 MiB"' in line and "other" not in line
    marker = suggest_toml([entry], headroom=Decimal(10), form="marker")
    assert 'category_caps={"parameters": "1 MiB"' in marker


def test_inspect_and_the_html_report_show_the_peak_by_category(tracked: tuple[Path, Any, Any]) -> None:
    from memgate import html_report
    from memgate.report import inspect_text

    directory, model, _ = tracked
    cache, _ = _measured(directory)
    entry = profile_entry(cache.info, cache.get())
    parameters = _storage_bytes(model.parameters())
    line = next(line for line in inspect_text(entry) if "categories at peak:" in line)
    assert f"parameters 37.25 KiB ({parameters} B)" in line  # 38_144 B
    table = html_report._categories_table(entry["devices"][0])
    assert "<h4>Categories at the peak</h4>" in table and f'<td class="num exact">{parameters}</td>' in table
    assert html_report._categories_table({"metrics": {}}) == ""


def test_a_model_built_before_the_recording_is_said_to_lie_outside_the_window(tmp_path: Path) -> None:
    """record(dir, track=[...]) with a model built before recording started: a CPU trace holds no block of
    its parameters (nothing counted as parameters), and the profile's notes say how many bytes that is."""
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    model = torch.nn.Linear(IN, HIDDEN)
    with record(tmp_path / "prof", track=[model]) as rec:
        for _ in range(2):
            model(torch.randn(BATCH, IN)).sum().backward()
            rec.step()
    cache, device = _measured(tmp_path / "prof")
    assert device.values["category_bytes_at_peak"]["parameters"] == 0
    assert device.values["category_bytes_at_peak"]["gradients"] == _storage_bytes(p.grad for p in model.parameters())
    params = _storage_bytes(model.parameters())
    assert any(f"{params} bytes, lie in no block of the window" in note for note in cache.info.metadata["notes"])


@pytest.mark.parametrize(("ts", "found"), [('"garbled"', "'garbled'"), ('"1e999999"', "'1e999999'"),
                                           ("-5.000", "'-5.000'")])
def test_a_garbled_note_timestamp_names_the_event_by_its_index(tmp_path: Path, ts: str, found: str) -> None:
    """The error named ``traceEvents (memgate::note).ts``: which of the notes, it did not say."""
    _snapshot_recording(tmp_path / "rec")
    trace = tmp_path / "rec" / "torch_trace.json"
    trace.write_text(trace.read_text().replace('"ts": 1900.000', f'"ts": {ts}'))
    with pytest.raises(InputError) as info:
        load(discover(tmp_path / "rec")[0])
    assert (info.value.file, info.value.column) == (str(trace), "traceEvents[1] (memgate::note).ts")
    assert info.value.one_line().endswith(f", found {found}") and len(info.value.one_line()) < 300
