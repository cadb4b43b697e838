"""Every shipped JSON Schema is valid, and agrees with real files, the budget example and the report."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from memgate import cli
from memgate.schemas import load_schema, schema_names

ASCEND = Path(__file__).parent / "data" / "samples" / "ascend"
SAMPLE_CSVS = sorted(
    p for p in ASCEND.glob("*/*.csv")
    if f"torch_npu.{p.stem}" in schema_names()  # operator_details.csv has no schema: memgate never reads it
)
TEXT_SAMPLES = sorted(p for p in ASCEND.iterdir() if p.is_dir() and not any(p.glob("*.db")))

# The budget table of docs/design.md ("Budget file"), verbatim.
DESIGN_BUDGETS = """
[tool.memgate]
profiles = "prof_dir"            # optional default root when --memgate has no value

[[tool.memgate.budgets]]
name = "train-step"              # required, unique; appears in item ids and reports
ranks = "*"                      # optional globs over rank labels / devices
devices = "*"
component = "PTA+GE"             # optional series override
warmup_steps = 1                 # optional, for step_growth / leaked
peak_allocated = "24 GiB"        # any subset of the limits below
peak_reserved = "26 GiB"
peak_app_reserved = "30 GiB"
fragmentation = 0.15
step_growth = "16 MiB"
leaked = "64 MiB"
op_caps = { "aten::matmul*" = "2 GiB", "cann::*" = "512 MiB" }
"""


def test_samples_are_present() -> None:
    assert {p.name for p in SAMPLE_CSVS} == {"memory_record.csv", "operator_memory.csv", "npu_module_mem.csv",
                                              "step_trace_time.csv", "kernel_details.csv"}
    assert len(TEXT_SAMPLES) == 4


@pytest.mark.parametrize("name", schema_names())
def test_schema_is_valid_draft_2020_12(name: str) -> None:
    schema = load_schema(name)
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("path", SAMPLE_CSVS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_row_of_a_real_sample_validates(path: Path) -> None:
    """Row by row with jsonschema, the cells as the csv module reads them (empty = null)."""
    schema = load_schema(f"torch_npu.{path.stem}")
    validator = Draft202012Validator(schema)
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        variants = schema["x-memgate-headers"].values()
        if schema.get("additionalProperties", False):
            assert any(set(v) <= set(header) for v in variants), header
        else:
            assert header in list(variants), header
        rows = 0
        for record in reader:
            row = {k: (v if v != "" else None) for k, v in zip(header, record, strict=True)}
            errors = [e.message for e in validator.iter_errors(row)]
            assert not errors, f"line {reader.line_num}: {errors}"
            rows += 1
    assert rows > 0


@pytest.mark.parametrize("path", [p for p in SAMPLE_CSVS if p.name == "memory_record.csv"], ids=lambda p: p.parent.name)
def test_schema_rejects_a_corrupted_sample_row(path: Path) -> None:
    """The same schemas do reject what they should: a unit suffix, a comma decimal, a missing device."""
    validator = Draft202012Validator(load_schema("torch_npu.memory_record"))
    with open(path, encoding="utf-8", newline="") as fh:
        row = next(r for r in csv.DictReader(fh) if r["Component"] == "PTA")
    row = {k: (v if v != "" else None) for k, v in row.items()}
    assert validator.is_valid(row)
    for column, bad in (("Total Allocated(MB)", "954.37MB"), ("Total Reserved(MB)", "1452,0"),
                        ("Device Type", None), ("Component", "PTA "), ("Timestamp(us)", "1736408883694238.150\t\t")):
        assert not validator.is_valid({**row, column: bad}), column


# -- budgets.schema.json ------------------------------------------------------------------------------

def _design_table() -> dict[str, Any]:
    return tomllib.loads(DESIGN_BUDGETS)["tool"]["memgate"]  # type: ignore[no-any-return]


def test_budgets_schema_accepts_the_design_example() -> None:
    Draft202012Validator(load_schema("budgets")).validate(_design_table())


@pytest.mark.parametrize(
    ("where", "key", "value"),
    [
        ("top", "profile", "prof_dir"),  # typo of 'profiles'
        ("top", "budget", []),
        ("budget", "peak_alocated", "24 GiB"),  # typo of a limit: an error, never silently ignored
        ("budget", "leak", "64 MiB"),
        ("budget", "op_caps", {"aten::mm": "2 GiBs"}),
        ("budget", "peak_allocated", "24 GiB extra"),
        ("budget", "peak_allocated", "24 PiB"),
        ("budget", "peak_allocated", -1),
        ("budget", "fragmentation", 1.5),
        ("budget", "warmup_steps", -1),
        ("budget", "name", ""),
    ],
)
def test_budgets_schema_rejects_unknown_keys_and_bad_values(where: str, key: str, value: object) -> None:
    table = _design_table()
    target = table if where == "top" else table["budgets"][0]
    target[key] = value
    with pytest.raises(ValidationError):
        Draft202012Validator(load_schema("budgets")).validate(table)


def test_budgets_schema_requires_a_name() -> None:
    table = _design_table()
    del table["budgets"][0]["name"]
    assert not Draft202012Validator(load_schema("budgets")).is_valid(table)


# -- report.schema.json ---------------------------------------------------------------------------------

def _inspect_json(path: Path) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["inspect", str(path), "--json"])
    assert code == 0
    return json.loads(out.getvalue())  # type: ignore[no-any-return]


def _max_mb(path: Path, component: str, column: str) -> int:
    """Max of a memory_record column for one component, in bytes, straight from the raw file."""
    with open(path, encoding="utf-8", newline="") as fh:
        values = [float(r[column]) for r in csv.DictReader(fh) if r["Component"] == component and r[column]]
    return round(max(values) * (1 << 20))


@pytest.mark.parametrize("sample", TEXT_SAMPLES, ids=lambda p: p.name)
def test_inspect_json_of_a_real_sample_validates_against_the_report_schema(sample: Path) -> None:
    report = _inspect_json(sample)
    Draft202012Validator(load_schema("report")).validate(report)
    [profile] = report["profiles"]
    assert profile["format"] == "torch_npu" and profile["rank"] == "0"
    record = sample / "memory_record.csv"
    if record.exists():  # the metric values are the raw file's, not just well-typed
        [device] = profile["devices"]
        metrics = device["metrics"]
        assert metrics["peak_allocated_bytes"] == _max_mb(record, "PTA+GE", "Total Allocated(MB)")
        assert metrics["peak_reserved_bytes"] == _max_mb(record, "PTA+GE", "Total Reserved(MB)")
        assert metrics["peak_app_reserved_bytes"] == _max_mb(record, "APP", "Total Reserved(MB)")


def test_report_schema_rejects_a_float_byte_count() -> None:
    report = _inspect_json(TEXT_SAMPLES[0])
    device = report["profiles"][0]["devices"][0]
    device["metrics"]["peak_allocated_bytes"] = 1.5
    assert not Draft202012Validator(load_schema("report")).is_valid(report)
