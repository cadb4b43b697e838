"""The JSON of ``prof.export_memory_timeline``: the ``[times, sizes]`` form and the raw rows.

Expected values are derived here from the raw JSON with the json module and plain loops, never
copied from memgate's output; the raw exports are made by the installed torch (CPU).
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from memgate.discover import discover, load
from memgate.errors import InputError
from memgate.loaders.kineto import memory_timeline
from memgate.metrics import profile_metrics
from memgate.schemas import load_schema

TORCH = Path(__file__).parent / "data" / "samples" / "torch"
TIMELINE = TORCH / "cpu_memory_timeline.json"


def test_memory_timeline_sample() -> None:
    times, sizes = json.loads(TIMELINE.read_bytes())
    profile = memory_timeline.load_timeline(TIMELINE)
    [model] = profile.devices
    [m] = profile_metrics(profile)
    assert model.device == "unknown"
    assert m.values["peak_allocated_bytes"] == max(sum(row) for row in sizes)
    assert model.series["allocator"].frame.ints("t_ns").tolist() == [t * 1000 for t in times]


# ---- the raw form of export_memory_timeline ---------------------------------------------------------


@pytest.fixture(scope="module")
def timelines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real exports by the installed torch (CPU) of one recording: the raw form (``*.raw.json.gz``),
    the ``[times, sizes]`` form (``*.json``), and what torch writes for a ``*.raw.json`` name."""
    torch = pytest.importorskip("torch")
    import warnings

    from torch.profiler import ProfilerActivity, profile

    out = tmp_path_factory.mktemp("timeline")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    paths = {"raw_gz": out / "run_rank2.raw.json.gz", "coalesced": out / "run_memory_timeline.json",
             "raw_name_coalesced": out / "plain.raw.json"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # export_memory_timeline is deprecated (still in 2.13)
        for path in paths.values():
            prof.export_memory_timeline(str(path), device="cpu")
    paths["raw"] = out / "unzipped.raw.json"
    paths["raw"].write_bytes(gzip.decompress(paths["raw_gz"].read_bytes()))
    paths["raw_hta"] = out / "memory_timeline.raw.gz"  # how Holistic Trace Analysis keeps the raw form
    paths["raw_hta"].write_bytes(paths["raw_gz"].read_bytes())
    return paths


def raw_rows(path: Path) -> list[list[int]]:
    data = path.read_bytes()
    rows: list[list[int]] = json.loads(gzip.decompress(data) if path.name.endswith(".gz") else data)
    return rows


def test_the_raw_timeline_export_is_rows_of_four_integers(timelines: dict[str, Path]) -> None:
    """What torch writes, pinned: sorted by (t, action), t in ns (-1: PREEXISTING), actions 1..4."""
    rows = raw_rows(timelines["raw_gz"])
    assert rows and all(len(r) == 4 and all(type(v) is int for v in r) for r in rows)
    assert rows == sorted(rows, key=lambda r: (r[0], r[1]))
    assert {r[1] for r in rows} <= {1, 2, 3, 4} and all((r[0] == -1) == (r[1] == 1) for r in rows)
    assert max(r[0] for r in rows) > 2**53  # ns since the epoch: more digits than a float holds
    jsonschema.Draft202012Validator(load_schema("torch_memory_timeline_raw")).validate(rows)


@pytest.mark.parametrize("which", ["raw_gz", "raw", "raw_hta"])
def test_the_raw_timeline_loads_with_exact_numbers(timelines: dict[str, Path], which: str) -> None:
    path = timelines[which]
    rows = raw_rows(path)
    [found] = discover(path)
    assert found.format.name == "torch_memory_timeline_raw"
    profile = load(found)
    [model] = profile.devices
    assert (profile.format, profile.rank, model.device) == ("torch_memory_timeline_raw", "2" if "rank2" in path.name
                                                            else "0", "unknown")
    first = min(r[0] for r in rows if r[0] >= 0)
    timed = sorted(((r[0] if r[0] >= 0 else first), k) for k, r in enumerate(rows))
    running, total = [], 0
    for _, k in timed:
        total += rows[k][2]
        running.append(total)
    frame = model.series["allocator"].frame.to_pandas()
    assert frame["t_ns"].tolist() == [t for t, _ in timed]
    assert frame["allocated"].tolist() == running
    [m] = profile_metrics(profile)
    assert m.values["peak_allocated_bytes"] == max(running)
    for key in ("leaked_bytes", "op_max_block_bytes", "top_at_peak"):
        assert "records sizes by category" in m.missing[key]


def test_the_raw_and_the_coalesced_timeline_agree(timelines: dict[str, Path]) -> None:
    """The same recording: the raw rows end where the [times, sizes] form's last row does, and no
    coalesced state (one per µs) is above the raw peak."""
    _, sizes = json.loads(timelines["coalesced"].read_bytes())
    raw_series = memory_timeline.load_raw_timeline(timelines["raw_gz"]).devices[0].series["allocator"].frame.to_pandas()["allocated"]
    assert int(raw_series.iloc[-1]) == sum(sizes[-1])
    assert int(raw_series.max()) >= max(sum(row) for row in sizes)


def test_a_raw_json_name_holding_the_times_sizes_form_reads_as_that_form(timelines: dict[str, Path]) -> None:
    """torch writes [times, sizes] for ``export_memory_timeline("x.raw.json")`` (only ``raw.json.gz``
    gets rows): memgate reads what the file holds."""
    path = timelines["raw_name_coalesced"]
    assert memory_timeline.claims_raw_timeline(path) and not memory_timeline.claims_timeline(path)
    profile = load(discover(path)[0])
    assert profile.format == "torch_memory_timeline"
    _, sizes = json.loads(path.read_bytes())
    assert profile_metrics(profile)[0].values["peak_allocated_bytes"] == max(sum(row) for row in sizes)


def test_a_root_scan_finds_every_timeline_form(timelines: dict[str, Path], tmp_path: Path) -> None:
    for path in timelines.values():
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "notes.raw.json").write_text('{"raw": true}')  # a raw.json name that is no timeline: not claimed
    found = {f.path.name: f.format.name for f in discover(tmp_path)}
    assert found == {"run_rank2.raw.json.gz": "torch_memory_timeline_raw", "unzipped.raw.json": "torch_memory_timeline_raw",
                     "plain.raw.json": "torch_memory_timeline_raw", "run_memory_timeline.json": "torch_memory_timeline",
                     "memory_timeline.raw.gz": "torch_memory_timeline_raw"}


RAW_BAD = {  # edit of the real rows -> (row, column) named, words of the message
    "row of three": (lambda rows: rows[7].pop(), (7, None), "[t, action, bytes, category]"),
    "action 5": (lambda rows: rows[7].__setitem__(1, 5), (7, 1), "value not allowed"),
    "category 8": (lambda rows: rows[7].__setitem__(3, 8), (7, 3), "value too large"),
    "bytes as text": (lambda rows: rows[7].__setitem__(2, "4096"), (7, 2), "wrong type"),
    "t before -1": (lambda rows: rows[7].__setitem__(0, -2), (7, 0), "value too small"),
    "bytes past int64": (lambda rows: rows[7].__setitem__(2, 2**63), (7, 2), "wrong type"),
}


def _raw_variant(timelines: dict[str, Path], tmp_path: Path, edit: Any) -> tuple[Path, list[list[Any]]]:
    rows: list[list[Any]] = raw_rows(timelines["raw_gz"])
    edit(rows)
    path = tmp_path / "bad.raw.json.gz"
    path.write_bytes(gzip.compress(json.dumps(rows).encode()))
    return path, rows


@pytest.mark.parametrize("case", sorted(RAW_BAD))
def test_a_bad_raw_timeline_row_is_named(timelines: dict[str, Path], tmp_path: Path, case: str) -> None:
    edit, (row, column), words = RAW_BAD[case]
    path, _ = _raw_variant(timelines, tmp_path, edit)
    with pytest.raises(InputError) as info:
        load(discover(path)[0])
    assert info.value.file == str(path)
    assert info.value.column == f"[{row}]" + (f"[{column}]" if column is not None else "")
    assert words in info.value.one_line()


def _row_of(rows: list[list[int]], action: int, sign: int = 0) -> int:
    return next(k for k, r in enumerate(rows) if r[1] == action and r[2] * sign >= 0)


RAW_INCONSISTENT = {  # rows torch never writes -> (the row named, its column, words of the message)
    "create with t -1": (lambda rows: rows[_row_of(rows, 2)].__setitem__(0, -1), lambda rows: _row_of(rows, 2), 0,
                         "t is -1 exactly for PREEXISTING"),
    "destroy that allocates": (lambda rows: rows[_row_of(rows, 4)].__setitem__(2, 64), lambda rows: _row_of(rows, 4), 2,
                               "DESTROY row allocates"),
    "half an increment": (lambda rows: rows.pop(_row_of(rows, 3) + 1), lambda rows: _row_of(rows, 3), 2,
                          "INCREMENT_VERSION row without its pair"),
    "a free of nothing": (lambda rows: rows.insert(6, [rows[6][0], 4, -(10**12), 0]), lambda rows: 6, 2,
                          "memory below zero"),
}


@pytest.mark.parametrize("case", sorted(RAW_INCONSISTENT))
def test_raw_rows_that_contradict_each_other_are_refused(timelines: dict[str, Path], tmp_path: Path,
                                                         case: str) -> None:
    edit, row_of, column, words = RAW_INCONSISTENT[case]
    path, rows = _raw_variant(timelines, tmp_path, edit)
    with pytest.raises(InputError) as info:
        memory_timeline.load_raw_timeline(path)
    assert info.value.column == f"[{row_of(rows)}][{column}]", info.value.one_line()
    assert words in info.value.message


def test_an_empty_raw_timeline_and_one_without_times(tmp_path: Path) -> None:
    empty = tmp_path / "empty.raw.json"
    empty.write_text("[]")
    assert memory_timeline.claims_raw_timeline(empty)
    assert len(memory_timeline.load_raw_timeline(empty).devices[0].series["allocator"].frame) == 0
    before = tmp_path / "before.raw.json"
    before.write_text("[[-1, 1, 512, 0], [-1, 1, 1024, 7]]")
    profile = memory_timeline.load_raw_timeline(before)
    frame = profile.devices[0].series["allocator"].frame.to_pandas()
    assert frame["allocated"].tolist() == [512, 1536] and frame["t_ns"].tolist() == [0, 0]
    assert "no row has a time" in profile.metadata["times_note"]
