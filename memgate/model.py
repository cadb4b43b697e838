"""The normalized memory model every loader produces and everything after reads.

Bytes are int64, times are int64 ns since the epoch, devices are ``npu:0`` / ``cuda:0`` / ``cpu``.
Frames use pandas nullable ``Int64`` where a value may be missing (a block allocated before the
profiling window has no ``t_alloc``; an APP sample has no ``allocated``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

SERIES_COLUMNS = ("t_ns", "allocated", "reserved", "active")
BLOCK_COLUMNS = ("size", "t_alloc", "t_free", "op", "stream", "owner", "component", "alloc_total")
STEP_COLUMNS = ("step", "t_start", "t_end")

# Component names of the framework allocator, by preference, and of the whole process.
FRAMEWORK_COMPONENTS = ("PTA+GE", "MindSpore+GE", "PTA", "MindSpore", "allocator", "GE")
APP_COMPONENT = "APP"


def empty_series() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype="Int64") for c in SERIES_COLUMNS})


def empty_blocks() -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series([], dtype="Int64") for c in ("size", "t_alloc", "t_free", "alloc_total")})
    for c in ("op", "stream", "owner", "component"):
        frame[c] = pd.Series([], dtype="string")
    return frame[list(BLOCK_COLUMNS)]


def typed_blocks(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame``'s BLOCK_COLUMNS with the model's dtypes (Int64 numbers, string text)."""
    out = empty_blocks().reindex(range(len(frame)))
    for column in ("size", "t_alloc", "t_free", "alloc_total"):
        out[column] = pd.array(frame[column], dtype="Int64")
    for column in ("op", "stream", "owner", "component"):
        out[column] = pd.array(frame[column], dtype="string")
    return out[list(BLOCK_COLUMNS)]


def split_series(frame: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(device, component, SERIES_COLUMNS frame in time order) for each pair in a long frame."""
    out = []
    for (device, component), group in frame.groupby(["device", "component"], sort=True):
        series = group[list(SERIES_COLUMNS)].sort_values("t_ns", kind="stable")
        out.append((str(device), str(component), series.reset_index(drop=True).astype("Int64")))
    return out


def empty_steps() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype="Int64") for c in STEP_COLUMNS})


@dataclass(frozen=True)
class Series:
    """Time-ordered samples of one component on one device."""

    component: str
    frame: pd.DataFrame  # SERIES_COLUMNS
    source: str  # file (and table) it came from


@dataclass(frozen=True)
class DeviceModel:
    device: str
    series: dict[str, Series] = field(default_factory=dict)
    blocks: pd.DataFrame = field(default_factory=empty_blocks)  # BLOCK_COLUMNS
    blocks_source: str | None = None
    # Series whose sum is written as another series (torch_npu PTA+GE = PTA + GE).
    sum_components: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Profile:
    """One rank's output, normalized."""

    path: str
    format: str
    rank: str
    devices: tuple[DeviceModel, ...]
    steps: pd.DataFrame = field(default_factory=empty_steps)  # STEP_COLUMNS
    steps_source: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
