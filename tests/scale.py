"""Make a heavier copy of a torch_npu profile: every allocation and total scaled by a factor."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

SCALED_SUFFIXES = ("(MB)", "(KB)")
EXAMPLE = Path(__file__).parents[1] / "examples" / "profiles" / "alexnet_3016828_20250109_ascend_pt"
BASE_AND_HEAVY_BUDGETS = '[[budgets]]\nname = "train"\npeak_allocated = "4 GiB"\n'


def scaled_copy(source: Path, target: Path, factor: float, ops: tuple[str, ...] | None = None) -> Path:
    """Copy ``source`` to ``target`` with memory_record / operator_memory sizes × ``factor``.

    ``ops`` limits operator_memory scaling to those op names (totals are scaled regardless).
    Values are rounded to whole 512-byte units (torch_npu's block granule), so the text stays exact
    and a factor of 1.0 changes nothing.
    """
    shutil.copytree(source, target)
    out = target / "ASCEND_PROFILER_OUTPUT" if (target / "ASCEND_PROFILER_OUTPUT").is_dir() else target
    for name in ("memory_record.csv", "operator_memory.csv"):
        path = out / name
        if not path.exists():
            continue
        raw = path.read_bytes()
        newline = "\r\n" if b"\r\n" in raw else "\n"
        rows = list(csv.reader(raw.decode("utf-8").splitlines()))
        header, body = rows[0], rows[1:]
        for row in body:
            if name == "operator_memory.csv" and ops is not None and row[0] not in ops:
                continue
            for i, column in enumerate(header):
                if not column.endswith(SCALED_SUFFIXES) or row[i] == "":
                    continue
                kib = float(row[i]) * (1024 if column.endswith("(MB)") else 1)
                scaled_kib = round(kib * factor * 2) / 2
                row[i] = repr(scaled_kib / 1024) if column.endswith("(MB)") else repr(scaled_kib)
        text = newline.join(",".join(r) for r in rows) + newline
        path.write_bytes(text.encode("utf-8"))
    return target


def base_and_heavy(root: Path, heavy: float = 1.10) -> None:
    """Two runs of the example under ``root``: ``base/run_ascend_pt`` as recorded and
    ``heavy/run_ascend_pt`` with every size × ``heavy``."""
    for name, factor in (("base", 1.0), ("heavy", heavy)):
        (root / name).mkdir()
        scaled_copy(EXAMPLE, root / name / "run_ascend_pt", factor)
