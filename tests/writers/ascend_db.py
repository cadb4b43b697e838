"""Render a ground-truth :class:`groundtruth.Trace` as Ascend profiler sqlite dbs (docs/formats-reference.md §1, §3).

- :func:`write_torch_db`: ``ascend_pytorch_profiler[_{rank}].db`` as torch_npu's db parsers write it:
  ``MEMORY_RECORD`` (PTA and GE rows after every event, each followed by a ``PTA+GE`` row = the sum
  of both components' latest totals), ``OP_MEMORY`` (one row per block; GE blocks named without
  ``cann::`` and without a stream; a block allocated before the window has a negative size and NULL
  allocation columns; NULL release columns = never freed), ``STEP_TIME``, ``STRING_IDS``,
  ``META_DATA``, ``RANK_DEVICE_MAP``, ``NPU_MEM``.
- :func:`write_msprof_db`: a CANN ``msprof_*.db`` with ``NPU_OP_MEM`` allocate/release events for
  every block (one allocator, component GE), plus ``NPU_MEM`` and ``NPU_MODULE_MEM``; with
  ``enum_memory`` in the early db export's form, the ``type`` columns keyed into ``ENUM_MEMORY``.

Every value is bytes and ns, as in the real files, so a reader must reproduce the trace exactly.
Each component is its own caching allocator here: reserved = running max of its allocated rounded
up to 2 MiB (what :meth:`groundtruth.Trace.reserved_by_allocator_curve` sums).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from groundtruth import RESERVE_GRANULE, Block, Trace

INVALID_ID = 4294967295
FIRST_STRING_ID = 536870912  # torch_npu's memory parser starts its string ids here


def _connect(path: Path) -> sqlite3.Connection:
    """A fresh db; the real writers' journal/fsync settings do not matter to a reader."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    return conn


def _ceil(value: int) -> int:
    return -(-value // RESERVE_GRANULE) * RESERVE_GRANULE


class _Strings:
    def __init__(self, start: int = FIRST_STRING_ID) -> None:
        self.ids: dict[str, int] = {}
        self.next = start

    def __call__(self, text: str) -> int:
        if text not in self.ids:
            self.ids[text] = self.next
            self.next += 1
        return self.ids[text]

    def rows(self) -> list[tuple[int, str]]:
        return [(i, s) for s, i in self.ids.items()]


def _create(conn: sqlite3.Connection, table: str, columns: str) -> None:
    conn.execute(f"CREATE TABLE {table} ({columns})")


def component_totals(trace: Trace) -> tuple[dict[str, int], list[tuple[int, Block, int, dict[str, int], dict[str, int]]]]:
    """Per-component (allocated, reserved) after each event: (t, block, delta, allocated, reserved)."""
    names = sorted({"PTA", *(b.component for b in trace.blocks)})
    level = {c: (trace.hidden_baseline if c == "PTA" else 0) for c in names}
    for b in trace.blocks:
        if b.t_alloc is None:
            level[b.component] += b.size
    high = {c: _ceil(level[c]) for c in names}
    start = dict(level)
    out = []
    for t, _kind, delta, block in trace.events():
        level[block.component] += delta
        high[block.component] = max(high[block.component], _ceil(level[block.component]))
        out.append((t, block, delta, dict(level), dict(high)))
    return start, out


def torch_db_name(rank: int | None) -> str:
    return "ascend_pytorch_profiler.db" if rank is None else f"ascend_pytorch_profiler_{rank}.db"


def write_torch_db(trace: Trace, directory: Path, *, rank: int | None = 0) -> Path:
    path = directory / torch_db_name(rank)
    strings = _Strings()
    conn = _connect(path)
    try:
        _create(conn, "MEMORY_RECORD", "component INTEGER, timestamp INTEGER, totalAllocated INTEGER, "
                "totalReserved INTEGER, totalActive INTEGER, streamPtr INTEGER, deviceId INTEGER")
        _create(conn, "OP_MEMORY", "name INTEGER, size INTEGER, allocationTime INTEGER, releaseTime INTEGER, "
                "activeReleaseTime INTEGER, duration INTEGER, activeDuration INTEGER, allocationTotalAllocated INTEGER, "
                "allocationTotalReserved INTEGER, allocationTotalActive INTEGER, releaseTotalAllocated INTEGER, "
                "releaseTotalReserved INTEGER, releaseTotalActive INTEGER, streamPtr INTEGER, deviceId INTEGER")
        _create(conn, "STEP_TIME", "id INTEGER, startNs INTEGER, endNs INTEGER")
        _create(conn, "META_DATA", "name TEXT, value TEXT")
        _create(conn, "RANK_DEVICE_MAP", "rankId INTEGER, deviceId INTEGER")
        _create(conn, "NPU_MEM", "type INTEGER, ddr NUMERIC, hbm NUMERIC, timestampNs INTEGER, deviceId INTEGER")
        _create(conn, "STRING_IDS", "id INTEGER PRIMARY KEY, value TEXT")
        dev = trace.device_id
        _start, events = component_totals(trace)
        records = []
        at_alloc: dict[int, tuple[int, int]] = {}
        at_free: dict[int, tuple[int, int]] = {}
        for t, block, delta, level, high in events:
            c = block.component
            stream = block.stream if c == "PTA" else None
            active = level[c] if c == "PTA" else 0
            records.append((strings(c), t, level[c], high[c], active, stream, dev))
            total_alloc = sum(level.values())
            total_res = sum(high.values())
            records.append((strings("PTA+GE"), t, total_alloc, total_res, level["PTA"], stream, dev))
            (at_alloc if delta > 0 else at_free)[id(block)] = (level[c], high[c])
        conn.executemany("INSERT INTO MEMORY_RECORD VALUES (?,?,?,?,?,?,?)", records)
        ops = []
        ordered = sorted(trace.blocks, key=lambda b: (b.component != "PTA",
                                                      b.t_alloc if b.t_alloc is not None else b.t_free or 0))
        for b in ordered:
            ge = b.component == "GE"
            name = strings(b.op.removeprefix("cann::") if ge else b.op)
            alloc = at_alloc.get(id(b))
            free = at_free.get(id(b))
            size = b.size if b.t_alloc is not None else -b.size
            duration = b.t_free - b.t_alloc if b.t_alloc is not None and b.t_free is not None else None
            ops.append((
                name, size, b.t_alloc, b.t_free, None if ge else b.t_free, duration, None if ge else duration,
                alloc[0] if alloc else None, alloc[1] if alloc else None, None if ge or not alloc else alloc[0],
                free[0] if free else None, free[1] if free else None, None if ge or not free else free[0],
                None if ge else b.stream, dev,
            ))
        conn.executemany(f"INSERT INTO OP_MEMORY VALUES ({','.join('?' * 15)})", ops)
        conn.executemany("INSERT INTO STEP_TIME VALUES (?,?,?)", list(trace.steps))
        conn.executemany("INSERT INTO META_DATA VALUES (?,?)", [("SCHEMA_VERSION", "1.0.0"), ("SCHEMA_VERSION_MAJOR", "1")])
        conn.execute("INSERT INTO RANK_DEVICE_MAP VALUES (?,?)", (INVALID_ID if rank is None else rank, dev))
        app = strings("app")
        conn.executemany("INSERT INTO NPU_MEM VALUES (?,?,?,?,?)", app_samples(trace, app))
        conn.executemany("INSERT INTO STRING_IDS VALUES (?,?)", strings.rows())
        conn.commit()
    finally:
        conn.close()
    return path


def app_samples(trace: Trace, app_id: int) -> list[tuple[int, int, int, int, int]]:
    """Two APP samples (process memory = reserved + 1 GiB of runtime), at the window's ends."""
    reserved = max(r for _, r in trace.reserved_by_allocator_curve())
    return [(app_id, 0, reserved + (1 << 30), trace.t_start, trace.device_id),
            (app_id, 4096, reserved + (1 << 30), trace.t_end, trace.device_id)]


def app_peak(trace: Trace) -> int:
    return max(r for _, r in trace.reserved_by_allocator_curve()) + (1 << 30) + 4096


# ENUM_MEMORY of msprof's early db export (2024), as in the real sample msinsight_msprof_db_2024_enum_memory:
# NPU_OP_MEM's type ids there; NPU_MEM's app/device are its ids 0/1 (the event codes msprof maps to text today).
ENUM_MEMORY = {"app": 0, "device": 1, "read": 3, "write": 4, "allocate": 5, "release": 6}


def write_msprof_db(trace: Trace, directory: Path, *, name: str = "msprof_20250101000000.db",
                    enum_memory: bool = False) -> Path:
    """CANN tables only: every block becomes NPU_OP_MEM events of one GE allocator (hidden baseline
    included in its totals). ``enum_memory``: the type columns hold ENUM_MEMORY ids, whatever STRING_IDS
    holds under the same numbers."""
    path = directory / name
    strings = _Strings(start=1)
    kind = ENUM_MEMORY.__getitem__ if enum_memory else strings
    conn = _connect(path)
    try:
        _create(conn, "NPU_OP_MEM", "operatorName INTEGER, addr INTEGER, type INTEGER, size INTEGER, "
                "timestampNs INTEGER, globalTid INTEGER, totalAllocate NUMERIC, totalReserve NUMERIC, component INTEGER, "
                "deviceId INTEGER")
        _create(conn, "NPU_MEM", "type INTEGER, ddr NUMERIC, hbm NUMERIC, timestampNs INTEGER, deviceId INTEGER")
        _create(conn, "NPU_MODULE_MEM", "moduleId INTEGER, timestampNs INTEGER, totalReserved NUMERIC, deviceId INTEGER")
        _create(conn, "ENUM_MODULE", "id INTEGER PRIMARY KEY, name TEXT")
        _create(conn, "STRING_IDS", "id INTEGER PRIMARY KEY, value TEXT")
        level = trace.hidden_baseline + sum(b.size for b in trace.blocks if b.t_alloc is None)
        high = _ceil(level)
        # Addresses are reused like a caching allocator does (latest freed first).
        address: dict[int, int] = {}
        free_list: list[int] = []
        next_addr = 0x12C000000000
        for b in trace.blocks:
            if b.t_alloc is None:
                address[id(b)] = next_addr
                next_addr += 1 << 32
        rows = []
        for t, _kind, delta, b in trace.events():
            level += delta
            high = max(high, _ceil(level))
            if delta > 0:
                if free_list:
                    address[id(b)] = free_list.pop()
                else:
                    address[id(b)] = next_addr
                    next_addr += 1 << 32
            else:
                free_list.append(address[id(b)])
            rows.append((strings(b.op.removeprefix("cann::")) if b.op else None, address[id(b)],
                         kind("allocate" if delta > 0 else "release"), b.size, t, 4242, level, high,
                         strings("GE"), trace.device_id))
        conn.executemany(f"INSERT INTO NPU_OP_MEM VALUES ({','.join('?' * 10)})", rows)
        conn.executemany("INSERT INTO NPU_MEM VALUES (?,?,?,?,?)", app_samples(trace, kind("app"))
                         + [(kind("device"), 0, app_peak(trace) + (1 << 20), trace.t_end, trace.device_id)])
        if enum_memory:
            _create(conn, "ENUM_MEMORY", "id INTEGER PRIMARY KEY, name TEXT")
            conn.executemany("INSERT INTO ENUM_MEMORY VALUES (?,?)", [(i, n) for n, i in ENUM_MEMORY.items()])
        conn.executemany("INSERT INTO ENUM_MODULE VALUES (?,?)", [(0, "SLOG"), (33, "APP"), (45, "GE")])
        conn.executemany("INSERT INTO NPU_MODULE_MEM VALUES (?,?,?,?)",
                         [(m, trace.t_start, r, trace.device_id) for m, r in ((0, 0), (33, high), (45, 1 << 21))])
        conn.executemany("INSERT INTO STRING_IDS VALUES (?,?)", strings.rows())
        conn.commit()
    finally:
        conn.close()
    return path
