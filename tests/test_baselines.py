"""memgate.baselines: baseline documents built from report entries, read back as entries, ratcheted,
and a marked test's profile keyed by its node id."""

from __future__ import annotations

from typing import Any

from memgate.baselines import baseline_entries, baseline_from_entries, history_entry


def _entry(path: str, rank: str = "0", peak: int = 100, **meta: Any) -> dict[str, Any]:
    return {"rank": rank, "format": "kineto", "path": path, "metadata": meta,
            "devices": [{"device": "cpu", "metrics": {"peak_allocated_bytes": peak, "top_at_peak": [],
                                                      "live_at_peak_count": 3},
                         "pool_of": {}}]}


def test_ratchet_keeps_the_pool_of_the_value_kept() -> None:
    from memgate.baselines import ratchet

    def baseline(frag: float, pool: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        metrics = {"fragmentation": frag, "external_fragmentation": 0.1, **(extra or {})}
        return {"memgate_baseline": 1, "profiles": {"0": {"key": {"format": "x"}, "devices": {"npu:0": {
            "metrics": metrics, "pool_of": {"fragmentation": pool, "external_fragmentation": pool}}}}}}

    merged = ratchet(baseline(0.1, "PTA"), baseline(0.2, "GE", {"leak_undetermined_bytes": 5}))
    device = merged["profiles"]["0"]["devices"]["npu:0"]
    assert device["metrics"] == {"fragmentation": 0.1, "external_fragmentation": 0.1, "leak_undetermined_bytes": 5}
    assert device["pool_of"] == {"fragmentation": "PTA", "external_fragmentation": "GE"}  # a tie keeps the new
    old_format = {"memgate_baseline": 1, "profiles": {"0": {"key": {"format": "x"}, "devices": {"npu:0": {
        "metrics": {"fragmentation": 0.05}}}}}}
    device = ratchet(old_format, baseline(0.2, "GE"))["profiles"]["0"]["devices"]["npu:0"]
    assert device["metrics"]["fragmentation"] == 0.05 and "fragmentation" not in device["pool_of"]


def test_a_baseline_keeps_numbers_not_holders_and_reads_back_as_entries() -> None:
    baseline = baseline_from_entries([_entry("/a/p0"), _entry("/a/p1", peak=7)], commit="c0ffee", dirty=True)
    assert list(baseline) == ["memgate_baseline", "memgate_version", "metadata", "profiles"]
    assert baseline["metadata"] == {"git_commit": "c0ffee", "git_dirty": True}
    assert list(baseline["profiles"]) == ["0:p0", "0:p1"]  # one rank, two profiles: rank and path
    assert baseline["profiles"]["0:p1"]["devices"]["cpu"]["metrics"] == {"peak_allocated_bytes": 7}
    [first, second] = baseline_entries(baseline)
    assert (first["path"], second["path"], second["baseline_commit"]) == ("/a/p0", "/a/p1", "c0ffee-dirty")
    assert second["devices"] == [{"device": "cpu", "metrics": {"peak_allocated_bytes": 7}, "pool_of": {}}]


def test_a_marked_test_is_kept_by_its_node_id() -> None:
    entry = _entry("/tmp/pytest-1/memgate_profile0", test="tests/test_a.py::test_b")
    assert history_entry(entry)["path"] == "tests/test_a.py::test_b"
    assert history_entry(entry)["metadata"]["profile_dir"] == "/tmp/pytest-1/memgate_profile0"
    assert history_entry(entry, 2)["path"] == "tests/test_a.py::test_b/memgate_profile0"  # several: by folder too
    assert history_entry(_entry("/p"))["path"] == "/p"  # no test: its path
