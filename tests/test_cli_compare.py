"""`memgate diff` and `memgate suggest` on real profiles."""

from __future__ import annotations

import csv
import io
import itertools
import json
import tomllib
from decimal import Decimal
from pathlib import Path

import pytest
from scale import scaled_copy

from memgate.budgets import parse_budget_table
from memgate.cli import main

EXAMPLE = Path(__file__).parents[1] / "examples" / "profiles" / "alexnet_3016828_20250109_ascend_pt"
MM_MAX = 150995456  # largest aten::mm block of the example (144 MiB), from operator_memory.csv


def _edit_ops(profile: Path, edit: dict[str, tuple[str, float]]) -> None:
    """Rename and/or resize operator_memory rows: {old name: (new name, size factor)}."""
    path = profile / "ASCEND_PROFILER_OUTPUT" / "operator_memory.csv"
    rows = list(csv.reader(io.StringIO(path.read_bytes().decode("utf-8"))))
    for row in rows[1:]:
        if row[0] in edit:
            name, factor = edit[row[0]]
            row[0], row[1] = name, repr(float(row[1]) * factor)
    path.write_bytes(("\r\n".join(",".join(r) for r in rows) + "\r\n").encode("utf-8"))


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    base = scaled_copy(EXAMPLE, tmp_path / "base" / "run_ascend_pt", 1.0)
    current = scaled_copy(EXAMPLE, tmp_path / "current" / "run_ascend_pt", 1.0)
    _edit_ops(current, {"aten::mm": ("aten::mm", 2.0), "aten::eq": ("aten::new_op", 1.0)})
    return base.parent, current.parent


def test_diff_names_the_operator_that_grew_and_the_new_one(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(runs[0]), str(runs[1])]) == 0
    out = capsys.readouterr().out.splitlines()
    grew = [line for line in out if "op grew:" in line]
    assert grew == ["  op grew: aten::mm 144.00 MiB -> 288.00 MiB (+144.00 MiB)"]
    assert "  new op:  aten::new_op 3.50 KiB" in out
    assert "  gone op: aten::eq (was 3.50 KiB)" in out


def test_diff_json_and_fail_rule(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(runs[0]), str(runs[1]), "--json", "--fail", "peak_allocated:5%"]) == 0
    diff = json.loads(capsys.readouterr().out)
    (device,) = diff["ranks"][0]["devices"]
    assert device["ops_grew"] == [{"op": "aten::mm", "base": MM_MAX, "current": 2 * MM_MAX, "delta": MM_MAX}]
    assert device["metrics"]["peak_allocated_bytes"]["delta"] == 0
    assert diff["regressions"][0]["passed"] is True


def test_diff_fails_on_a_grown_peak(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = scaled_copy(EXAMPLE, tmp_path / "b" / "run_ascend_pt", 1.0).parent
    heavy = scaled_copy(EXAMPLE, tmp_path / "h" / "run_ascend_pt", 1.1).parent
    assert main(["diff", str(base), str(heavy), "--fail", "peak_allocated:5%"]) == 1
    out = capsys.readouterr().out
    assert "FAILED peak_allocated 1.35 GiB exceeds baseline 1.23 GiB" in out


def test_diff_accepts_json_reports_and_baselines(runs: tuple[Path, Path], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "base.json"
    assert main(["inspect", str(runs[0]), "--json"]) == 0
    report.write_text(capsys.readouterr().out)
    assert main(["diff", str(report), str(runs[1])]) == 0
    assert "op grew: aten::mm" in capsys.readouterr().out


def test_diff_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(tmp_path / "nope"), str(EXAMPLE)]) == 2
    assert capsys.readouterr().err.startswith("memgate: error: ")
    assert main(["diff", str(EXAMPLE), str(EXAMPLE), "--fail", "peak:5"]) == 2


def test_suggest_prints_budgets_that_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["suggest", str(EXAMPLE), "--headroom", "10%", "--name", "alexnet"]) == 0
    text = capsys.readouterr().out
    table = tomllib.loads(text)["tool"]["memgate"]
    budgets = parse_budget_table(table, "suggested").budgets
    (budget,) = budgets
    assert budget.name == "alexnet"
    assert budget.limits["peak_allocated"] >= 1322299392 * 1.1
    assert budget.op_caps["aten::mm"] >= MM_MAX * 1.1
    (tmp_path / "pyproject.toml").write_text(text)
    assert main(["check", str(EXAMPLE), "--budgets", str(tmp_path / "pyproject.toml")]) == 0


def test_suggest_rejects_bad_headroom(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["suggest", str(EXAMPLE), "--headroom", "lots"]) == 2
    assert "headroom" in capsys.readouterr().err


# ---- every LIMITS metric in diff and suggest -----------------------------------------------------

SAMPLES = Path(__file__).parent / "data" / "samples"
MSMEMSCOPE = SAMPLES / "msmemscope"
PROFILE_SAMPLES = sorted(
    [p for p in (SAMPLES / "ascend").iterdir() if p.is_dir()]
    + [p for p in (SAMPLES / "msmemscope").iterdir() if p.suffix == ".csv"]
    + [p for p in (SAMPLES / "torch").iterdir() if p.name.endswith((".json", ".json.gz", ".pickle"))]
) + [EXAMPLE]
MIB = 1 << 20


def msmemscope_pta_pool(path: Path) -> tuple[float, float]:
    """(fragmentation, external_fragmentation) of the PTA pool, from the MALLOC/FREE rows' total/used attrs.

    fragmentation = 1 - max used / max total; external = at each growth of total, (total - used) of the
    row before over total after, the largest.
    """
    with path.open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["Event Type"] == "PTA" and r["Event"] in ("MALLOC", "FREE")]
    rows.sort(key=lambda r: (int(r["Timestamp(ns)"]), int(r["ID"])))
    points = []
    for r in rows:
        attr = dict(kv.split(":", 1) for kv in r["Attr"].strip("{}").split(","))
        points.append((int(attr["total"]), int(attr["used"])))
    external = max([(t0 - u0) / t1 for (t0, u0), (t1, _) in itertools.pairwise(points) if t1 > t0], default=0.0)
    return 1 - max(u for _, u in points) / max(t for t, _ in points), external


def test_diff_shows_external_fragmentation_as_a_ratio_with_its_pool(capsys: pytest.CaptureFixture[str]) -> None:
    base, leaks = MSMEMSCOPE / "example_compare_baseline.csv", MSMEMSCOPE / "example_compare_leaks.csv"
    (frag_a, ext_a), (frag_b, ext_b) = msmemscope_pta_pool(base), msmemscope_pta_pool(leaks)
    assert (round(ext_a, 3), round(ext_b, 3)) == (0.1, 0.426)
    assert main(["diff", str(base), str(leaks)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "rank 0 npu:0"
    assert (f"  {'fragmentation':<24} {frag_a:>12.3f} -> {frag_b:>12.3f}  {frag_b - frag_a:+.3f} "
            f"({(frag_b - frag_a) / frag_a * 100:+.1f}%)  pool PTA") in out
    assert ("  external_fragmentation          0.100 ->        0.426  +0.326 (+326.2%)  pool PTA") in out
    assert "  peak_reserved               20.00 MiB ->    38.00 MiB  +18.00 MiB (+90.0%)" in out
    # nothing measured in either run is left out, not printed as "- -> -"
    assert not any(line.lstrip().startswith(("leak_undetermined", "free_block_fragmentation")) for line in out)


def test_diff_json_has_every_metric_with_its_unit_and_pools(capsys: pytest.CaptureFixture[str]) -> None:
    from memgate.budgets import LIMITS

    base, leaks = MSMEMSCOPE / "example_compare_baseline.csv", MSMEMSCOPE / "example_compare_leaks.csv"
    (_, ext_a), (_, ext_b) = msmemscope_pta_pool(base), msmemscope_pta_pool(leaks)
    assert main(["diff", str(base), str(leaks), "--json"]) == 0
    (device,) = json.loads(capsys.readouterr().out)["ranks"][0]["devices"]
    assert list(device["metrics"]) == [key for key, _ in LIMITS.values()]
    assert device["metrics"]["external_fragmentation"] == {
        "base": ext_a, "current": ext_b, "delta": ext_b - ext_a, "unit": "ratio", "base_pool": "PTA",
        "current_pool": "PTA"}
    assert device["metrics"]["leak_undetermined_bytes"] == {"base": None, "current": None, "delta": None, "unit": "bytes"}


@pytest.mark.parametrize(("rule", "status", "verdict"), [
    ("external_fragmentation:+0.325", 1, ("FAILED external_fragmentation 0.426 exceeds baseline 0.100 by 0.326 "
                                         "(+326.2%), allowed +0.325 — rank 0 npu:0, pool PTA")),
    ("external_fragmentation:+0.326", 0, ("ok     external_fragmentation 0.426 vs baseline 0.100: +0.326 (+326.2%), "
                                         "allowed +0.326 — rank 0 npu:0, pool PTA")),
    ("external_fragmentation:330%", 0, ("ok     external_fragmentation 0.426 vs baseline 0.100: +0.326 (+326.2%), "
                                       "allowed +330% — rank 0 npu:0, pool PTA")),
])
def test_diff_fail_rule_on_external_fragmentation(rule: str, status: int, verdict: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # 0.09990234375 + 0.325 < 0.42583264802631576 <= 0.09990234375 + 0.326
    base, leaks = MSMEMSCOPE / "example_compare_baseline.csv", MSMEMSCOPE / "example_compare_leaks.csv"
    assert main(["diff", str(base), str(leaks), "--fail", rule]) == status
    assert verdict in capsys.readouterr().out.splitlines()


def _pools_of(memory_record: Path) -> dict[str, float]:
    """fragmentation per component from memory_record.csv: 1 - max Total Allocated / max Total Reserved."""
    alloc: dict[str, Decimal] = {}
    reserved: dict[str, Decimal] = {}
    with memory_record.open(newline="") as fh:
        for row in csv.DictReader(fh):
            c = row["Component"]
            if row["Total Allocated(MB)"]:
                alloc[c] = max(alloc.get(c, Decimal(0)), Decimal(row["Total Allocated(MB)"]))
            if row["Total Reserved(MB)"]:
                reserved[c] = max(reserved.get(c, Decimal(0)), Decimal(row["Total Reserved(MB)"]))
    return {c: 1 - float(alloc[c]) / float(reserved[c]) for c in ("PTA", "GE")}


def test_diff_names_both_pools_when_the_worst_fragmentation_pool_changes(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    base = scaled_copy(EXAMPLE, tmp_path / "base" / "run_ascend_pt", 1.0)
    current = scaled_copy(EXAMPLE, tmp_path / "current" / "run_ascend_pt", 1.0)
    record = current / "ASCEND_PROFILER_OUTPUT" / "memory_record.csv"
    rows = list(csv.reader(io.StringIO(record.read_bytes().decode("utf-8"))))
    for row in rows[1:]:
        if row[0] == "GE" and row[3]:
            row[3] = repr(float(row[3]) * 4)  # GE reserves 4x: its pool is now the worst one
    record.write_bytes(("\r\n".join(",".join(r) for r in rows) + "\r\n").encode("utf-8"))
    before, after = _pools_of(base / "ASCEND_PROFILER_OUTPUT" / "memory_record.csv"), _pools_of(record)
    assert before["PTA"] > before["GE"] and after["GE"] > after["PTA"]
    was, now = before["PTA"], after["GE"]
    assert main(["diff", str(base.parent), str(current.parent), "--fail", "fragmentation:+0.05"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert (f"  {'fragmentation':<24} {was:>12.3f} -> {now:>12.3f}  {now - was:+.3f} "
            f"({(now - was) / was * 100:+.1f}%)  pool PTA -> GE") in out
    assert (f"FAILED fragmentation {now:.3f} exceeds baseline {was:.3f} by {now - was:.3f} "
            f"({(now - was) / was * 100:+.1f}%), allowed +0.05 — rank 0 npu:0, pool GE (baseline pool PTA)") in out


def _suggest(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main(["suggest", str(path), *extra]) == 0
    return capsys.readouterr().out


def _measured(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, float]:
    """The worst value of each LIMITS key over the devices of ``path`` (memgate inspect --json)."""
    from memgate.budgets import LIMITS

    assert main(["inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    worst: dict[str, float] = {}
    for profile in report["profiles"]:
        for device in profile["devices"]:
            for budget_key, (metric_key, _) in LIMITS.items():
                value = device["metrics"].get(metric_key)
                if value is not None:
                    worst[budget_key] = max(worst.get(budget_key, value), value)
    return worst


@pytest.mark.parametrize("sample", PROFILE_SAMPLES, ids=lambda p: p.name)
def test_suggest_round_trips_on_every_sample(sample: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The block loads back through parse_budget_table, every limit can fail, none is 0, and it passes
    `memgate check` on the profile it was suggested from."""
    from memgate.budgets import LIMITS
    from memgate.suggest import NO_FLOOR_KEYS

    measured = _measured(sample, capsys)
    text = _suggest(sample, capsys)
    (budget,) = parse_budget_table(tomllib.loads(text)["tool"]["memgate"], "suggested").budgets
    # every measured metric is proposed, except largest_free_block (said so in a comment)
    assert set(budget.limits) == set(measured) - {"largest_free_block"}
    if "largest_free_block" in measured:
        assert "# largest_free_block not suggested (measured " in text
    for key, limit in budget.limits.items():
        assert limit >= measured[key], key
        if LIMITS[key][1] == "ratio":
            assert 0.010 <= limit < 1.0, (key, limit)
        elif key in NO_FLOOR_KEYS:  # growth: 0 measured stays 0 B, anything else rounds up to whole MiB
            assert limit >= MIB or limit == measured[key] == 0, (key, limit)
        else:
            assert limit >= MIB, (key, limit)
    assert all(size >= MIB for size in budget.op_caps.values())
    (tmp_path / "pyproject.toml").write_text(text)
    assert main(["check", str(sample), "--budgets", str(tmp_path / "pyproject.toml")]) == 0, capsys.readouterr()


def test_suggest_keeps_zero_growth_and_leaks_at_0_b(capsys: pytest.CaptureFixture[str]) -> None:
    sample = SAMPLES / "torch" / "cpu_train_active6_profile_memory.json"
    measured = _measured(sample, capsys)
    assert (measured["step_growth"], measured["leaked"]) == (0, 0)
    lines = _suggest(sample, capsys).splitlines()
    assert 'step_growth = "0 B"  # measured 0 B; no growth measured, none allowed' in lines
    assert 'leaked = "0 B"  # measured 0 B; no growth measured, none allowed' in lines
    assert (f'leak_undetermined = "1 MiB"  # measured {measured["leak_undetermined"] / 1024:.2f} KiB') in lines


def test_suggest_caps_ratios_below_1_and_floors_them_at_0_010(capsys: pytest.CaptureFixture[str]) -> None:
    # A snapshot whose allocator reserved 37 MiB for 117 KiB: fragmentation 0.997; its pool never grew
    # with free memory in it: external_fragmentation 0.
    sample = SAMPLES / "torch" / "kineto_cpu_profile_to_snapshot.pickle"
    measured = _measured(sample, capsys)
    assert 0.99 < measured["fragmentation"] < 0.999 and measured["external_fragmentation"] == 0
    lines = _suggest(sample, capsys).splitlines()
    assert ("fragmentation = 0.999  # measured 0.997, pool allocator; capped below 1 (a ratio limit of 1 can "
            "never fail)") in lines
    assert ("external_fragmentation = 0.010  # measured 0.000; 0.010 is the smallest suggested "
            "ratio") in lines
    assert any(line.startswith("# largest_free_block not suggested (measured 19.85 MiB): ") for line in lines)


def test_suggest_caps_instances_of_one_kernel_by_a_glob(capsys: pytest.CaptureFixture[str]) -> None:
    """The example's cann::trans_TransData_0 .. _24 instances get one cap, from their largest block."""
    with open(EXAMPLE / "ASCEND_PROFILER_OUTPUT" / "operator_memory.csv", newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["Name"].startswith("cann::trans_TransData_")]
    assert len({r["Name"] for r in rows}) > 1
    largest = max(Decimal(r["Size(KB)"]) * 1024 for r in rows)
    text = _suggest(EXAMPLE, capsys)
    (budget,) = parse_budget_table(tomllib.loads(text)["tool"]["memgate"], "suggested").budgets
    assert not any(glob.startswith("cann::trans_TransData_") and glob[-1].isdigit() for glob in budget.op_caps)
    cap = budget.op_caps["cann::trans_TransData_*"]
    assert cap >= largest * Decimal("1.1") and cap % MIB == 0 and cap - MIB < largest * Decimal("1.1")


def test_suggest_rank_imbalance_over_two_ranks_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two ranks, rank 1's peak 4.9 % below rank 0's: rank_imbalance is the measured 0.049 plus the
    10 % headroom, rounded up to 0.001; it loads back and passes `memgate check` on the root."""
    from test_budgets_cross_rank import make_ranks

    root = make_ranks(tmp_path / "root")
    text = _suggest(root, capsys, "--headroom", "10%")
    [line] = [ln for ln in text.splitlines() if ln.startswith("rank_imbalance")]
    assert line.startswith("rank_imbalance = { peak_allocated = 0.054 }  # measured 0.049 over 2 profiles"), line
    (budget,) = parse_budget_table(tomllib.loads(text)["tool"]["memgate"], "suggested").budgets
    assert budget.rank_imbalance == {"peak_allocated": 0.054}
    (tmp_path / "pyproject.toml").write_text(text)
    assert main(["check", str(root), "--budgets", str(tmp_path / "pyproject.toml")]) == 0, capsys.readouterr()



@pytest.mark.parametrize("headroom", ["NaN", "nan%", "Infinity", "-Infinity", "1e999999", "1e2", "-5", "-0.5%", "sNaN",
                                      "²", "１０", "٣%", "1_0", "1001", "10000%", "0x10", "10.1234567", "9" * 5000, ""])
def test_suggest_headroom_is_a_finite_ascii_percentage(headroom: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Decimal() takes NaN, Infinity, 1e999999, other scripts' digits and '1_0': each is one usage error."""
    capsys.readouterr()
    assert main(["suggest", str(EXAMPLE), f"--headroom={headroom}"]) == 2
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert line.startswith("memgate: error: invalid --headroom ") and len(line) < 250
    assert line.endswith("; expected a percentage from 0% to 1000% such as 10%") and captured.out == ""


@pytest.mark.parametrize(("headroom", "factor"), [("0", 1), ("1000%", 11), (" 2.5 % ", Decimal("1.025"))])
def test_suggest_headroom_bounds_are_taken(headroom: str, factor: Decimal, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["suggest", str(EXAMPLE), "--headroom", headroom, "--form", "toml"]) == 0
    (budget,) = parse_budget_table(tomllib.loads(capsys.readouterr().out), "suggested").budgets
    assert budget.limits["peak_allocated"] >= 1322299392 * factor


@pytest.mark.parametrize("run_id", ["²", "١", "１２"])
def test_diff_and_suggest_of_a_unicode_digit_run_id_is_one_error(tmp_path: Path, run_id: str,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """'²'.isdigit() is True and int('²') raises: no run ID, no such file, exit 2 (no internal error)."""
    monkeypatch.chdir(tmp_path)
    for args in (["diff", run_id, "latest"], ["diff", str(EXAMPLE), run_id], ["suggest", run_id]):
        capsys.readouterr()
        assert main(args) == 2, args
        assert capsys.readouterr().err.splitlines() == [
            (f"memgate: error: {run_id}: no such file or directory; expected a profile directory or file, "
            "found 'nothing at this path'")], args


@pytest.mark.parametrize("option", ["--jobs", "--warmup-steps", "--leak-horizon-steps"])
@pytest.mark.parametrize("value", ["２", "٣", "1_0", "9" * 5000, "0x3", "2.0"])
def test_integer_options_take_ascii_digits_only(option: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """int() would read '２' and '٣' as 2 and 3, '1_0' as 10, and raise on 5000 digits."""
    with pytest.raises(SystemExit) as info:
        main(["inspect", str(EXAMPLE), option, value])
    assert info.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert f"invalid int value: '{value[:20]}" in line and "(expected ASCII digits, at most 18)" in line
    assert len(line) < 300


def test_diff_top_takes_ascii_digits_only(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["diff", str(runs[0]), str(runs[1]), "--top", "５"])
    assert info.value.code == 2
    assert "argument --top: invalid int value: '５' (expected ASCII digits, at most 18)" in capsys.readouterr().err
    assert main(["diff", str(runs[0]), str(runs[1]), "--top", "0005"]) == 0
