"""The paths that make big inputs cheap give the same answers as the plain ones:

- a warm run reads metric results back from the cache without loading the profile's frames;
- CSV files are streamed in blocks: errors in any block name the file's line, results do not
  depend on the block size.

The vectorized paths of one module are checked against their plain formulations in that module's own
suite: split_series and split_chunks in tests/test_model.py, the block reconciliation and the
baseline's mode in tests/test_reconcile.py, persistent_growth in tests/test_metrics.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import PTA21_L1, PTA271, SAMPLES

from memgate.cache import ProfileCache, open_profile
from memgate.discover import discover, load
from memgate.errors import InputError
from memgate.metrics import MetricOptions, profile_metrics
from memgate.readers import csvtable
from memgate.session import process_profile

KINETO = SAMPLES / "torch" / "cpu_train_leak_profile_memory.json"
SNAPSHOT = SAMPLES / "torch" / "snapshot_newest_compile_context_windows_decomfl.pickle"


# ---- metric results in the cache ------------------------------------------------------------------


@pytest.mark.parametrize("path", [PTA271, KINETO, SNAPSHOT], ids=lambda p: p.name)
def test_warm_run_judges_from_stored_results_without_loading(path: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (found,) = discover(path)
    cache = ProfileCache(tmp_path / "cache")
    cold = process_profile(found, cache=cache)
    assert cold.error is None
    plain = process_profile(found)
    assert cold.entry == plain.entry
    # the second run must not load anything: every loader now fails
    monkeypatch.setattr("memgate.cache.load", lambda f: pytest.fail("loaded the profile on a warm run"))
    monkeypatch.setattr("memgate.cache._deserialize", lambda *a: pytest.fail("read the frames on a warm run"))
    warm = process_profile(found, cache=cache)
    assert warm.entry == plain.entry
    assert json.dumps(warm.entry) == json.dumps(plain.entry)


def test_missing_result_loads_the_frames_once(tmp_path: Path) -> None:
    (found,) = discover(PTA21_L1)
    cache = ProfileCache(tmp_path / "cache")
    open_profile(found, cache).get()
    warm = open_profile(found, cache)
    assert warm.get() is not None and warm._profile is None  # from the store
    other = warm.get(MetricOptions(warmup_steps=0))  # another warmup: not stored yet, computed from the cached frames
    assert warm._profile is not None
    assert [m.as_json() for m in other] == [m.as_json() for m in profile_metrics(load(found), MetricOptions(warmup_steps=0))]


def test_corrupt_result_file_is_recomputed(tmp_path: Path) -> None:
    (found,) = discover(PTA21_L1)
    cache = ProfileCache(tmp_path / "cache")
    want = [m.as_json() for m in open_profile(found, cache).get()]
    (result,) = list((tmp_path / "cache").glob("*/metrics-*.json"))
    result.write_text('{"key": "x", "devices": [')
    assert [m.as_json() for m in open_profile(found, cache).get()] == want
    assert json.loads(result.read_text())["devices"] == want  # written again, whole


# ---- streamed CSV -----------------------------------------------------------------------------------


def _small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(csvtable, "BLOCK_BYTES", 4096)  # many blocks even for a small sample


def test_block_size_does_not_change_the_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    (found,) = discover(PTA271)
    want = [m.as_json() for m in profile_metrics(load(found))]
    _small_blocks(monkeypatch)
    assert [m.as_json() for m in profile_metrics(load(found))] == want


@pytest.mark.parametrize("where", [0.1, 0.5, 0.97])
@pytest.mark.parametrize("bad", ["12x.5", "1e400"])
def test_error_in_any_block_names_its_line(where: float, bad: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A malformed cell (pattern) or one past int64 (conversion), early, mid-file or near the end."""
    _small_blocks(monkeypatch)
    shutil.copytree(PTA271, tmp_path / "p")
    path = next((tmp_path / "p").rglob("operator_memory.csv"))
    lines = path.read_text().splitlines(keepends=True)
    line = max(2, int(len(lines) * where))
    cells = lines[line - 1].split(",")
    column = lines[0].split(",").index("Allocation Total Allocated(MB)")
    cells[column] = bad
    lines[line - 1] = ",".join(cells)
    path.write_text("".join(lines))
    with pytest.raises(InputError) as info:
        load(next(iter(discover(tmp_path / "p"))))
    assert (info.value.file, info.value.line, info.value.column) == (str(path), line, "Allocation Total Allocated(MB)")
    assert repr(bad) in str(info.value.found)
