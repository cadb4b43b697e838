"""docs/contributing.md lists every file a new format or a new metric touches: a format registered, or a metric
added to the table, without one of them fails here (or in the test this module names for it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import test_cross_format
import test_fuzz
import test_metric_specs
import test_registry

from memgate import hints
from memgate.loaders import registry
from memgate.metric_specs import SPECS, Budgeted, Fact, MetricSpec, not_measurable
from memgate.schemas import load_schema

ROOT = Path(__file__).resolve().parent.parent
CONTRIBUTING = (ROOT / "docs" / "contributing.md").read_text("utf-8")
registry.import_loaders()
FORMATS = sorted(f.name for f in registry.FORMATS)

# Formats with no test-side writer in tests/writers/, each with why (test_cross_format compares the writers' metrics).
NO_WRITER = {
    "torch_memory_timeline": "sizes by category: no blocks, operators or steps to hold against the ground truth",
    "torch_memory_timeline_raw": "the same timeline, one row per allocation event, read back to the same figures",
    "torch_recording": "a snapshot and a Kineto trace of one process, each with its writer; memgate.record writes real ones",
}
# Formats whose every profile records its memory (hints.no_memory_data is never said for them).
ALWAYS_MEMORY = {
    "torch_memory_timeline": "the timeline is its allocator series",
    "torch_memory_timeline_raw": "the timeline is its allocator series",
}


def _section(title: str) -> str:
    start = CONTRIBUTING.index(f"## {title}\n")
    end = CONTRIBUTING.find("\n## ", start + 1)
    return CONTRIBUTING[start: end if end != -1 else len(CONTRIBUTING)]


def _named_files(text: str) -> set[str]:
    """The repository files a text names in backticks (placeholders such as ``<module>`` aside)."""
    return {m for m in re.findall(r"`([A-Za-z0-9_./-]+\.(?:py|md|json))`", text) if "/" in m or m == "CHANGELOG.md"}


@pytest.mark.parametrize("title", ["Adding a format", "Adding a metric"])
def test_every_file_contributing_names_exists(title: str) -> None:
    named = _named_files(_section(title))
    assert named, title
    missing = sorted(name for name in named if not (ROOT / name).exists())
    assert missing == [], f"docs/contributing.md ({title}) names files that do not exist: {missing}"


def test_the_format_checklist_names_every_file_this_test_checks() -> None:
    section = _section("Adding a format")
    for needed in ("memgate/loaders/registry.py", "memgate/hints.py", "tests/test_cross_format.py", "WRITERS",
                   "tests/test_fuzz.py", "tests/test_registry.py", "LOADER_CASES", "docs/formats.md",
                   "docs/formats-reference.md", "memgate/schemas/", "CHANGELOG.md"):
        assert needed in section, f"docs/contributing.md's format checklist does not name {needed}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_format_is_named_in_docs_formats(fmt: str) -> None:
    assert f"`{fmt}`" in (ROOT / "docs" / "formats.md").read_text("utf-8"), f"docs/formats.md does not name `{fmt}`"


def test_every_format_has_a_test_side_writer() -> None:
    assert set(NO_WRITER) <= set(FORMATS)
    assert {name for name in test_cross_format.WRITERS if name in FORMATS} == set(FORMATS) - set(NO_WRITER)


def test_every_format_has_a_fuzz_seed() -> None:
    assert {fmt for fmt, _ in test_fuzz.SEED_MAKERS.values()} == set(FORMATS)


def test_every_loader_that_claims_by_name_has_registry_cases() -> None:
    by_name = {loader.module for loader in registry.LOADERS if loader.files is not None}
    assert {module for modules in test_registry.LOADER_CASES.values() for module in modules} == by_name


@pytest.mark.parametrize("fmt", sorted(set(FORMATS) - set(ALWAYS_MEMORY)))
def test_a_format_says_how_to_record_its_memory_in_its_tools_words(fmt: str) -> None:
    generic = hints.no_memory_data("no such format", {})
    assert hints.no_memory_data(fmt, {}) != generic, f"memgate/hints.py's no_memory_data has no entry for {fmt}"


def test_every_schema_belongs_to_a_format_or_to_memgate() -> None:
    own = {"report", "baseline", "budgets", "recording"}  # memgate's own files (recording: its manifest)
    families = {name.split(".")[0] for name in (p.name for p in (ROOT / "memgate" / "schemas").glob("*.schema.json"))}
    assert families - own <= set(FORMATS)


# ---- a new metric ---------------------------------------------------------------------------------------------


def test_the_metric_checklist_names_every_file_a_metric_touches() -> None:
    section = _section("Adding a metric")
    for needed in ("memgate/metric_specs.py", "memgate/metrics.py", "report.schema.json", "baseline.schema.json",
                   "budgets.schema.json", "docs/metrics.md", "docs/budgets.md", "CHANGELOG.md", "needs"):
        assert needed in section, f"docs/contributing.md's metric checklist does not name {needed}"


def test_a_metric_added_to_the_table_alone_fails_until_its_files_are_in_step() -> None:
    """A toy budgeted metric, added to the table only: each file contributing.md names for it reports it missing."""
    toy = MetricSpec("toy_bytes", "bytes", "blocks", "a toy", budget=Budgeted("toy"),
                     needs=frozenset({Fact.OPERATORS}))
    specs = (*SPECS, toy)
    name, table, page = test_metric_specs._doc()
    problems = {
        "report.schema.json": test_metric_specs.report_schema_problems(specs, load_schema("report")),
        "baseline.schema.json": test_metric_specs.baseline_schema_problems(specs, load_schema("baseline")),
        "budgets.schema.json": test_metric_specs.budgets_schema_problems(specs, load_schema("budgets")),
        name: test_metric_specs.doc_problems(specs, table, page, name),
    }
    assert {where: any("toy" in p for p in found) for where, found in problems.items()} == dict.fromkeys(problems, True)
    # what it needs is in its spec: a profile lacking the operators says it is not measurable, no loader changed
    assert not_measurable({Fact.OPERATORS: "no ops"}, specs=specs)["toy_bytes"] == "no ops"
