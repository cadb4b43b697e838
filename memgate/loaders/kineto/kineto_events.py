"""What a Kineto trace load keeps of the events, batch by batch: the few ProfilerStep events whole,
``[memory]`` events, operator (``cpu_op``, older ``Operator``) and ``python_function`` spans as int64
columns (everything else is dropped with its batch), each batch checked against the schema as it
comes; of several bad events, the first in the file is reported.

Time: ``ts`` is µs with 3 decimals. ijson hands non-integers over as ``Decimal``, the json reader as
their text (:mod:`memgate.readers.traceevents`), so ``t_ns = ts * 1000`` is exact (sub-ns digits, which
Kineto never writes, are dropped): :func:`us_to_ns`, and :func:`plain_us_ns` for values that plainly
meet the schema.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memgate.categories import NOTE_PREFIX
from memgate.errors import InputError, show
from memgate.loaders.events import is_torch_file
from memgate.readers import convert
from memgate.readers.jsonstream import NumberText
from memgate.readers.pyrecords import check_column, check_records, resolve
from memgate.readers.traceevents import Events, as_decimal, with_decimals

MODULE_PREFIX = "nn.Module: "  # python_function spans of traces recorded with_modules=True
_FRAME = re.compile(r"^(?!<built-in)(.+?)\([0-9]+\): ")  # a with_stack frame: ``file.py(12): forward``
I64_MAX = (1 << 63) - 1
_PLAIN_US = r"^[0-9]+\.[0-9]{1,9}$"  # µs that convert exactly as text
_OP_FIELDS = ("name", "ts", "dur", "pid", "tid")  # what is kept of a cpu_op, in the order they are checked
# The cat of a CPU operator span: Kineto wrote "Operator" until June 2021 (torch <= 1.9; record_function
# ranges too), then its ActivityType name "cpu_op". A tuple: ``in`` compares, never hashes (a cat may be a list).
OP_CATEGORIES = ("cpu_op", "Operator")
# A tid Kineto wrote as a string of a number: until August 2021 it wrote an operator's tid as "5786"
# and a [memory] event's as 5786, one thread. Up to 19 digits (int() refuses thousands).
_DECIMAL_TID = re.compile(r"(?:0|[1-9][0-9]{0,18})\Z")


class Codes:
    """Integer codes for values met batch by batch (op names, pids, tids); 1 and "1" differ."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self._index: dict[tuple[type, Any], int] = {}

    def encode(self, values: list[Any], ints: bool = False) -> np.ndarray:
        """Codes of ``values``; ``ints``: all are ints within int64 (coded in C, not as objects).

        Distinct values are met in order of first appearance; a value equal to one met before in
        this batch (1 and True) takes its code, as a dict key would.
        """
        if ints:
            array = np.array(values, dtype=np.int64)
            uniques, first, local = np.unique(array, return_index=True, return_inverse=True)
            order = np.argsort(first, kind="stable")  # the distinct values in order of first appearance
            codes = np.empty(len(uniques) + 1, dtype=np.int64)
            codes[order] = [self._code(v) for v in uniques[order].tolist()]
            codes[-1] = self._code(None)
            return np.asarray(codes[local.reshape(-1)], dtype=np.int64)
        index: dict[Any, int] = {}
        setdefault = index.setdefault
        local = np.fromiter((-1 if v is None else setdefault(v, len(index)) for v in values), dtype=np.int64,
                            count=len(values))
        codes = np.array([self._code(v) for v in index] + [self._code(None)], dtype=np.int64)
        return np.asarray(codes[local], dtype=np.int64)  # a None (local code -1) takes the last one

    def _code(self, value: Any) -> int:
        key = (type(value), value)
        code = self._index.get(key)
        if code is None:
            code = self._index[key] = len(self.values)
            self.values.append(value)
        return code


@dataclass
class Kept:
    """One kind of event (memory events, cpu_ops) as int64 columns, appended batch by batch."""

    parts: dict[str, list[np.ndarray]] = field(default_factory=dict)
    count: int = 0
    problem: InputError | None = None  # of the first bad event: collecting stops there
    latest: tuple[int, str] = (-1, "")  # the largest ts in ns (before the base) and its text
    past_end: str | None = None  # the dur of the first event whose ts + dur is past int64 ns

    def append(self, **columns: np.ndarray) -> None:
        for name, values in columns.items():
            self.parts.setdefault(name, []).append(values)

    def column(self, name: str) -> np.ndarray:
        return np.concatenate(self.parts[name])

    def note_times(self, ns: np.ndarray, values: list[Any]) -> None:
        k = int(np.argmax(ns))
        if ns[k] > self.latest[0]:
            self.latest = (int(ns[k]), str(as_decimal(values[k])))


class Collected:
    """The events memgate needs, pulled out batch by batch: the few steps whole, memory events and
    operator spans (:data:`OP_CATEGORIES`) as columns (everything else is dropped with its batch)."""

    def __init__(self, path: Path, schema: dict[str, Any], base: int) -> None:
        self.path = path
        self.schema = schema
        self.base = base
        self.events = 0
        self.steps: list[dict[str, Any]] = []
        self.step_index: list[int] = []
        self.notes: list[dict[str, Any]] = []  # memgate::note#k spans: a tracked recording's moments
        self.note_index: list[int] = []  # each one's index in traceEvents, for an error to name
        self.mem = Kept()
        self.ops = Kept()
        self.op_names = Codes()
        self.py = Kept()  # python_function spans: nn.Module spans and user-code frames (owners)
        self.py_names = Codes()
        self.pids = Codes()
        self.tids = Codes()
        self.first_addr: dict[bool, int] = {}  # has Addr -> index of the first memory event that (has) not
        self.addr_count = {True: 0, False: 0}  # memory events with / without Addr
        x_event = resolve(schema["$defs"]["x_event"], schema)
        self.op_props = {key: resolve(prop, schema) for key, prop in x_event["properties"].items()}
        self.op_required = set(x_event["required"])
        self.mem_schema = resolve(schema["$defs"]["memory_event"], schema)
        self.mem_ts_prop = resolve(self.mem_schema["properties"]["ts"], schema)
        # The same without ts, for batches whose ts plainly meet the schema (see plain_us_ns)
        self.mem_schema_no_ts = {**self.mem_schema,
                                 "properties": {k: v for k, v in self.mem_schema["properties"].items() if k != "ts"},
                                 "required": [k for k in self.mem_schema["required"] if k != "ts"]}

    @classmethod
    def of(cls, batches: Iterator[Events], path: Path, schema: dict[str, Any], base: int) -> Collected:
        got = cls(path, schema, base)
        for batch in batches:
            got.add(batch)
        return got

    def add(self, events: list[dict[str, Any]]) -> None:
        """Sort a batch into steps, memory events and cpu_ops in one pass (each event is read while in cache)."""
        first = self.events
        self.events += len(events)
        mem: list[dict[str, Any]] = []
        mem_index: list[int] = []
        op_index: list[int] = []
        op_columns: dict[str, list[Any]] = {name: [] for name in _OP_FIELDS}
        add_name, add_ts, add_dur, add_pid, add_tid = (op_columns[name].append for name in _OP_FIELDS)
        py_index: list[int] = []
        py_columns: dict[str, list[Any]] = {name: [] for name in _OP_FIELDS}
        for i, event in enumerate(events):
            get = event.get
            ph = get("ph")
            if ph == "X":
                name = get("name")
                cat = get("cat")
                if type(name) is str and name.startswith(("ProfilerStep#", NOTE_PREFIX)):
                    if cat == "gpu_user_annotation":  # the GPU-side copy runs on device time
                        pass
                    elif name[0] == "P":
                        self.steps.append(with_decimals(event))
                        self.step_index.append(first + i)
                    else:
                        self.notes.append(with_decimals(event))
                        self.note_index.append(first + i)
                elif cat in OP_CATEGORIES:
                    op_index.append(first + i)
                    add_name(name)
                    add_ts(get("ts"))
                    add_dur(get("dur"))
                    add_pid(get("pid"))
                    add_tid(get("tid"))
                elif cat == "python_function" and type(name) is str and (name.startswith(MODULE_PREFIX)
                                                                          or _user_frame(name)):
                    py_index.append(first + i)
                    for key in _OP_FIELDS:
                        py_columns[key].append(get(key))
            elif get("name") == "[memory]":
                if ph != "i":  # read as another kind of event, its bytes would go unseen
                    raise InputError("a [memory] event that is not an instant event", file=self.path,
                                     column=f"traceEvents[{first + i}].ph",
                                     expected="'i' (Kineto's [memory] events)", found=show(ph, 20))
                mem.append(event)
                mem_index.append(first + i)
        self.mem.count += len(mem)
        self.ops.count += len(op_index)
        if mem and self.mem.problem is None:
            self._add_memory(mem, mem_index)
        if op_index and self.ops.problem is None:
            self._add_ops(op_columns, op_index)
        self.py.count += len(py_index)
        if py_index and self.py.problem is None:
            self._add_ops(py_columns, py_index, self.py, self.py_names)

    def _threads(self, pids: list[Any], tids: list[Any], arrays: Mapping[str, pa.Array | None]) -> np.ndarray:
        """One int64 per distinct (pid, tid); ``arrays``: the checked pid and tid columns. A tid string
        of digits is that number (:data:`_DECIMAL_TID`), for ops and memory events alike."""
        pid = self.pids.encode(pids, _all_ints(arrays["pid"]))
        ints = _all_ints(arrays["tid"])
        if not ints:
            tids = list(map(_thread_id, tids))
        return np.asarray((pid << 32) | self.tids.encode(tids, ints), dtype=np.int64)

    def _add_memory(self, records: list[dict[str, Any]], index: list[int]) -> None:
        n = len(records)

        def check(k: int, schema: Mapping[str, Any] = self.mem_schema) -> dict[str, pa.Array | None]:
            return check_records(records[:k], schema, file=self.path, where=lambda j: f"traceEvents[{index[j]}]",
                                 root=self.schema)

        ts, pids, tids = (list(map(dict.get, records, repeat(key))) for key in ("ts", "pid", "tid"))
        t = plain_us_ns(ts, self.mem_ts_prop)
        cols = None
        if t is not None:
            try:  # those ts are valid: check the rest
                cols = check(n, self.mem_schema_no_ts)
            except InputError:
                pass
        if cols is None or t is None or _text_numbers({"pid": pids, "tid": tids}, cols):
            records = [with_decimals(r) for r in records]  # check as ijson reads them, to name the first bad event
            ts, pids, tids = (list(map(dict.get, records, repeat(key))) for key in ("ts", "pid", "tid"))
            try:
                cols = check(n)
            except InputError as exc:
                self.mem.problem = _first_error(check, n, exc)
                return
            t = us_to_ns(ts, 0)
        self.mem.note_times(t, ts)
        total_alloc, no_alloc = _nullable(cols.get("args.Total Allocated"), n)
        total_res, no_res = _nullable(cols.get("args.Total Reserved"), n)
        addr, no_addr = _nullable(cols.get("args.Addr"), n)
        for has in (True, False):
            hits = np.flatnonzero(no_addr != has)
            self.addr_count[has] += len(hits)
            if len(hits) and has not in self.first_addr:
                self.first_addr[has] = index[int(hits[0])]
        self.mem.append(t=t, nbytes=convert.int64_or_zero(cols["args.Bytes"], n), addr=addr,
                        dtype=convert.int64_or_zero(cols["args.Device Type"], n), did=convert.int64_or_zero(cols["args.Device Id"], n),
                        total_alloc=total_alloc, no_alloc=no_alloc, total_res=total_res, no_res=no_res,
                        thread=self._threads(pids, tids, cols), event=np.asarray(index, dtype=np.int64))

    def _add_ops(self, columns: dict[str, list[Any]], index: list[int], kept: Kept | None = None,
                 names: Codes | None = None) -> None:
        """Keep complete events (cpu_ops, or ``kept``: python_function spans) as columns."""
        kept = self.ops if kept is None else kept
        names = self.op_names if names is None else names
        n = len(index)
        t, dur = (plain_us_ns(columns[name], self.op_props[name]) for name in ("ts", "dur"))
        arrays = None
        if t is not None and dur is not None:
            try:  # those ts and durs are valid: check the rest
                arrays = self._check_ops(columns, index, n, skip=("ts", "dur"))
            except InputError:
                pass
        if arrays is None or t is None or dur is None or _text_numbers({k: columns[k] for k in ("name", "pid", "tid")},
                                                                       arrays):
            columns = {name: list(map(as_decimal, values)) for name, values in columns.items()}  # as ijson reads them
            try:
                arrays = self._check_ops(columns, index, n)
            except InputError as exc:
                kept.problem = _first_error(lambda k: self._check_ops(columns, index, k), n, exc)
                return
            t, dur = us_to_ns(columns["ts"], 0), us_to_ns(columns["dur"], 0)
        kept.note_times(t, columns["ts"])
        past = dur > (I64_MAX - self.base) - t
        if kept.past_end is None and past.any():
            kept.past_end = str(as_decimal(columns["dur"][int(np.argmax(past))]))
        kept.append(t=t, dur=dur, name=names.encode(columns["name"]),
                        thread=self._threads(columns["pid"], columns["tid"], arrays))

    def _check_ops(self, columns: dict[str, list[Any]], index: list[int], k: int,
                   skip: tuple[str, ...] = ()) -> dict[str, pa.Array | None]:
        """Check the first k cpu_ops field by field (raises the first field's first problem); their columns."""
        arrays = {}
        for name, values in columns.items():
            if name in skip:
                continue
            arrays[name], problem = check_column(values[:k], self.op_props[name], name=name,
                                                 where=lambda j: f"traceEvents[{index[j]}]",
                                                 required=name in self.op_required)
            if problem is not None:
                raise problem.error(self.path)
        return arrays


def _thread_id(tid: Any) -> Any:
    """The thread a tid names: a string of a number (not a json reader's number text) as that int."""
    return int(tid) if type(tid) is str and _DECIMAL_TID.match(tid) else tid


def _integers(arr: pa.Array | None) -> bool:
    return arr is not None and pa.types.is_integer(arr.type)


def _all_ints(arr: pa.Array | None) -> bool:
    return arr is not None and pa.types.is_integer(arr.type) and arr.null_count == 0


def _text_numbers(columns: Mapping[str, list[Any]], checked: Mapping[str, pa.Array | None]) -> bool:
    """Do these checked columns hold a json reader's number? It passes as a string; only a column that
    Arrow did not type as integers can hold one."""
    return any(not _integers(checked[name]) and NumberText in set(map(type, values)) for name, values in columns.items())


def _first_error(check: Callable[[int], object], n: int, error: InputError) -> InputError:
    """The error of the first bad record of ``n`` (``check(k)`` validates the first k; all n fail with ``error``).

    A column check reports a wrong type before an out-of-range value earlier in the column, so the
    error of a whole batch would depend on where batches end; the shortest failing prefix does not.
    """
    good, bad = 0, n
    while bad - good > 1:
        mid = (good + bad) // 2
        try:
            check(mid)
            good = mid
        except InputError as exc:
            bad, error = mid, exc
    return error



def _user_frame(name: str) -> bool:
    """A with_stack frame (``path.py(line): function``) in user code, not in torch's own files."""
    frame = _FRAME.match(name)
    return frame is not None and not is_torch_file(frame.group(1))


def _nullable(arr: pa.Array | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values, missing mask) of an optional integer column."""
    if arr is None or pa.types.is_null(arr.type):
        return np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool)
    return convert.int64_or_zero(arr, n), np.asarray(arr.is_null(), dtype=bool)


# ---- µs to exact ns -------------------------------------------------------------------------------


def us_to_ns(values: list[Any], base: int, path: Path | None = None) -> np.ndarray:
    """Validated µs values (int or Decimal, <= 9e15 by the schema) → exact int64 ns + ``base``.

    Vectorized through decimal text; a sum past int64 (a huge ts on top of a base) is an InputError.
    """
    if not values:
        return np.zeros(0, dtype=np.int64)
    try:
        ns = _decimal_ns(_us_decimals(values))
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # > 9 decimals or floats: exact per value
        ns = np.array([int((Decimal(v) * 1000).to_integral_value()) for v in values], dtype=np.int64)
    if base and (ns > I64_MAX - base).any():
        raise InputError("ts + baseTimeNanoseconds is past the year 2262 (int64 ns)", file=path,
                         expected="ts relative to baseTimeNanoseconds", found=str(values[int(np.argmax(ns))]))
    return ns + base


def _us_decimals(values: list[Any]) -> pa.Array:
    """``values`` (ints and Decimals) as Arrow decimal128(38, 9); ArrowInvalid for a Decimal whose
    exponent is far out of that range (pyarrow 26 crashes the process converting ``1E-99999999``
    or ``0E-999999999`` to a decimal type, where ``1E-400`` is an error)."""
    try:
        exponents = list(map(Decimal.adjusted, values))
    except TypeError:  # ints among them
        exponents = [v.adjusted() for v in values if type(v) is Decimal]
    if exponents and not -_DECIMAL_EXPONENTS <= min(exponents) <= max(exponents) <= _DECIMAL_EXPONENTS:
        raise pa.ArrowInvalid("a decimal exponent out of range")
    return pa.array(values, type=pa.decimal128(38, 9))


_DECIMAL_EXPONENTS = 40  # decimal128(38, 9) holds values from 1e-9 to ~1e29


def _us_text_ns(text: pa.Array) -> np.ndarray:
    """µs text without nulls as int64 ns, converted in Arrow (convert.us_text_to_ns builds a pandas
    Series: pandas, ~0.2 s to import, is no part of a Kineto load)."""
    return np.asarray(convert.us_to_ns(text).to_numpy(zero_copy_only=False), dtype=np.int64)


def _decimal_ns(us: pa.Array) -> np.ndarray:
    text = pc.cast(us, pa.string())
    return _us_text_ns(text)


def plain_us_ns(values: list[Any], prop: Mapping[str, Any]) -> np.ndarray | None:
    """Exact ns of µs values that plainly meet ``prop`` (a number within bounds), else None.

    What check_column would accept, without its cost (Arrow infers a type for a Decimal at ~2 µs
    each). Another type, more than 9 decimals or a value near a bound gives None: check_column
    decides, and names the event.
    """
    if prop.keys() - {"type", "minimum", "maximum", "x-unit"} or prop.get("type") != "number":
        return None
    kinds = set(map(type, values))
    if kinds == {NumberText}:
        return _plain_text_us_ns(values, prop)
    if not kinds <= {Decimal, int}:
        return None
    try:
        us = _us_decimals(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return None
    zero = np.flatnonzero(pc.equal(us, 0).to_numpy(zero_copy_only=False))
    if any(values[i] != 0 for i in zero.tolist()):  # Arrow gives 0 for a Decimal like -1E-910 (not an error)
        return None
    bounds = pc.min_max(us)
    if bounds["min"].as_py() < prop["minimum"] or bounds["max"].as_py() > prop["maximum"]:
        return None
    return _decimal_ns(us)


def _plain_text_us_ns(values: list[NumberText], prop: Mapping[str, Any]) -> np.ndarray | None:
    """The same for the json reader's text. Digits with up to 9 decimals (Kineto writes 3) convert as
    their Decimal would, dropping sub-ns digits; the bounds are checked on the ns, a ns short of them."""
    text = pa.array(values, type=pa.string())
    if not pc.all(pc.match_substring_regex(text, _PLAIN_US)).as_py():
        return None
    try:
        ns = _us_text_ns(text)
    except InputError:  # an integer part past int64 ns
        return None
    if ns.min() < prop["minimum"] * 1000 or ns.max() >= prop["maximum"] * 1000:
        return None
    return ns

