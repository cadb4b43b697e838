"""memgate.loaders.ascend.crossfile: what each file of a profile directory covers (its devices, its time window),
and the files that cannot be one profile refused, on hand-made device models.

The same refusals on a real torch_npu export with its operator rows moved to another window or device:
tests/test_torch_npu.py; how far files that do overlap agree is memgate.reconcile's (tests/test_reconcile.py).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from memgate.errors import InputError
from memgate.loaders.ascend.crossfile import cross_file_facts
from memgate.model import BLOCK_COLUMNS, DeviceModel, Series, typed_blocks
from memgate.table import Table


def _series(name: str, times: list[int], source: Path | str) -> Series:
    frame = pd.DataFrame({"t_ns": times, "allocated": [1] * len(times), "reserved": [1] * len(times),
                          "active": [None] * len(times)}).astype("Int64")
    return Series(name, Table.from_pandas(frame), str(source))


def _blocks(spans: list[tuple[int | None, int | None]]) -> Table:
    """Blocks allocated and freed at ``spans`` (None: before the window / still live)."""
    frame = pd.DataFrame({"size": [1] * len(spans), "t_alloc": pd.array([a for a, _ in spans], dtype="Int64"),
                          "t_free": pd.array([f for _, f in spans], dtype="Int64"), "op": None, "stream": None,
                          "owner": None, "component": "PTA", "alloc_total": pd.array([None] * len(spans), dtype="Int64")})
    return typed_blocks(frame[list(BLOCK_COLUMNS)])


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for name in ("memory_record.csv", "operator_memory.csv", "npu_module_mem.csv", "profile.db"):
        (tmp_path / name).write_text("x")  # the sources name files that exist
    return tmp_path


def test_each_file_with_its_devices_and_time_window(root: Path) -> None:
    device = DeviceModel("npu:0", series={"PTA": _series("PTA", [100, 200], root / "memory_record.csv"),
                                          "APP": _series("APP", [50, 300], root / "npu_module_mem.csv")},
                         blocks=_blocks([(120, 150), (None, 180), (190, None)]),
                         blocks_source=str(root / "operator_memory.csv"))
    steps = Table.from_pandas(pd.DataFrame([(1, 110, 160)], columns=["step", "t_start", "t_end"]).astype("Int64"))
    assert cross_file_facts([device], root, steps, str(root / "kernel_details.csv")) == {
        "devices_by_file": {"memory_record.csv": ["npu:0"], "npu_module_mem.csv": ["npu:0"],
                            "operator_memory.csv": ["npu:0"]},
        "window_ns_by_file": {"kernel_details.csv": [110, 160], "memory_record.csv": [100, 200],
                              "npu_module_mem.csv": [50, 300],
                              "operator_memory.csv": [120, 190]},  # a block from before the window has no time
    }


def test_blocks_touching_the_totals_window_are_one_profile(root: Path) -> None:
    device = DeviceModel("npu:0", series={"PTA": _series("PTA", [100, 200], root / "memory_record.csv")},
                         blocks=_blocks([(50, 100)]), blocks_source=str(root / "operator_memory.csv"))
    assert cross_file_facts([device], root)["window_ns_by_file"]["operator_memory.csv"] == [50, 100]


def test_blocks_on_a_device_without_totals_beside_one_with_them_are_refused(root: Path) -> None:
    totals = DeviceModel("npu:0", series={"PTA": _series("PTA", [100, 200], root / "memory_record.csv")},
                         blocks=_blocks([(120, 150)]), blocks_source=str(root / "operator_memory.csv"))
    stray = DeviceModel("npu:1", blocks=_blocks([(120, 130)]), blocks_source=str(root / "operator_memory.csv"))
    with pytest.raises(InputError) as info:
        cross_file_facts([totals, stray], root)
    err = info.value
    assert (err.file, err.column, err.found) == (str(root / "operator_memory.csv"), None, "blocks on npu:1")
    assert err.message == ("the files of this profile name different devices: the blocks on npu:1 have no allocator "
                           "totals, memory_record.csv records them for npu:0 only (files of another rank or run?)")
    assert err.expected == f"blocks on the device(s) {root / 'memory_record.csv'} records: npu:0"
    # blocks alone, no totals on any device: nothing to disagree with
    assert cross_file_facts([stray], root)["devices_by_file"] == {"operator_memory.csv": ["npu:1"]}


def test_blocks_outside_the_totals_window_are_refused_naming_the_db_table(root: Path) -> None:
    db = root / "profile.db"
    device = DeviceModel("npu:0", series={"PTA": _series("PTA", [100, 200], f"{db}:MEMORY_RECORD")},
                         blocks=_blocks([(1000, 2000)]), blocks_source=f"{db}:OP_MEMORY")
    with pytest.raises(InputError) as info:
        cross_file_facts([device], db)
    err = info.value
    assert (err.file, err.column) == (str(db), "OP_MEMORY")
    assert err.message == ("npu:0: the blocks and the allocator totals of profile.db do not overlap in time: they "
                           "come from different runs or profiling windows")
    assert (err.expected, err.found) == (f"blocks inside the window of {db} (100..200 ns)", "blocks from 1000..2000 ns")



def test_steps_that_end_before_the_memory_records_begin_are_refused(root: Path) -> None:
    """A kernel_details.csv of another run beside the memory files (a real MindStudio fixture: its steps 134 days
    before its operator rows): each step would measure memory it never saw."""
    device = DeviceModel("npu:0", series={"PTA": _series("PTA", [1000, 2000], root / "memory_record.csv")},
                         blocks=_blocks([(1200, 1500)]), blocks_source=str(root / "operator_memory.csv"))
    early = Table.from_pandas(pd.DataFrame([(1, 10, 20), (2, 20, 30)], columns=["step", "t_start", "t_end"]).astype("Int64"))
    with pytest.raises(InputError) as info:
        cross_file_facts([device], root, early, str(root / "kernel_details.csv"))
    err = info.value
    assert err.file == str(root / "kernel_details.csv")
    assert err.message == ("the steps of kernel_details.csv all end before the memory records (memory_record.csv, "
                           "operator_memory.csv) begin: they come from another run or profiling window")
    assert (err.expected, err.found) == ("steps that meet the memory records' window (1000..2000 ns)",
                                         "steps from 10..30 ns")
    # steps after the last record stand (graph mode allocates before its steps), as do steps that meet the records
    for steps in ([(1, 3000, 4000)], [(1, 900, 1000)]):
        table = Table.from_pandas(pd.DataFrame(steps, columns=["step", "t_start", "t_end"]).astype("Int64"))
        facts = cross_file_facts([device], root, table, str(root / "kernel_details.csv"))
        assert facts["window_ns_by_file"]["kernel_details.csv"] == list(steps[0][1:])

