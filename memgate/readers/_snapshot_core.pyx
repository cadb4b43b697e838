# cython: language_level=3, boundscheck=True, wraparound=True, initializedcheck=True, cdivision=False
"""The compiled snapshot reader: a pickle VM for plain data that turns device-trace entries into columns.

It reads the file in chunks and walks its opcodes as CPython's Unpickler would, building the same
objects, except where a snapshot's trace entries lie (``root["device_traces"][d][i]``): an entry dict
is never built, its values go straight into typed columns, and its frames list becomes a stack id
(lists holding the same frame objects are one stack, decoded once). Everything it does not know, or
that the pure-Python reader might judge otherwise (a global, an opcode it does not read, a value the
schema refuses, a memo index past the file, a container count near the cap), raises ``Unsupported``:
the caller then reads the file with :mod:`memgate.readers.safepickle`, whose result or one-line error
is the answer. So the fast path only ever says yes to what the reference says yes to, with the same value.

Every byte is read through a bounds-checked typed memoryview (``boundscheck=True``); no pointer arithmetic.
"""

from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_FromLongLong
from cpython.unicode cimport PyUnicode_DecodeUTF8


cdef extern from "Python.h":
    int PyList_SetSlice(object lst, Py_ssize_t low, Py_ssize_t high, void* itemlist) except -1  # NULL: delete
from libc.stdint cimport uint64_t, int64_t, uintptr_t

cimport cython

import numpy as np


class Unsupported(Exception):
    """The compiled reader does not take this file: the pure-Python reader decides."""


cdef object CONSUMED = object()  # a memo slot of a trace entry turned into columns: no BINGET may name it
cdef long long INT64_MAX = 9223372036854775807
cdef long long TIME_US_MAX = 9223372036854775  # the schema's maximum for time_us
cdef Py_ssize_t CHUNK = 1 << 22
cdef Py_ssize_t MAX_MARKS = 100000
cdef long long MARGIN = 1024  # containers: near the cap the reference's own count decides
# Field ids of a trace entry, and the bit each sets in ``has``.
cdef enum:
    F_ACTION = 0
    F_ADDR = 1
    F_SIZE = 2
    F_STREAM = 3
    F_TIME = 4
    F_DEVFREE = 5
    F_FRAMES = 6
    F_CONTEXT = 7
    F_FORWARD = 8

cdef dict FIELDS = {"action": F_ACTION, "addr": F_ADDR, "size": F_SIZE, "stream": F_STREAM, "time_us": F_TIME,
          "device_free": F_DEVFREE, "frames": F_FRAMES, "compile_context": F_CONTEXT, "forward_frames": F_FORWARD}


cdef inline void bail(str why) except *:
    raise Unsupported(why)


cdef class _Entry:
    """A trace entry being read (its dict is never built)."""
    cdef long long memo
    cdef int code
    cdef long long addr, size, stream, time_us, device_free
    cdef int has
    cdef int sid
    cdef dict extras

    def __cinit__(self):
        self.memo = -1
        self.code = -1
        self.sid = -1


cdef class _Frames:
    """A frames list of a trace entry being read: its items, until the entry takes it as a stack."""
    cdef list items
    cdef long long memo

    def __cinit__(self):
        self.items = []
        self.memo = -1


@cython.final
cdef class _Trace:
    """One device trace as columns."""
    cdef long long memo
    cdef bint placed
    cdef Py_ssize_t n, cap
    cdef object a_code, a_addr, a_size, a_stream, a_time, a_devfree, a_has, a_sid
    cdef signed char[::1] code
    cdef long long[::1] addr, size, stream, time_us, device_free
    cdef unsigned short[::1] has
    cdef int[::1] sid
    cdef dict extras  # entry index -> {key: value} of the keys outside the columns

    def __cinit__(self):
        self.memo = -1
        self.extras = {}
        self._alloc(64)

    cdef void _alloc(self, Py_ssize_t cap) except *:
        cdef Py_ssize_t n = self.n
        arrays = []
        for old, dtype in ((self.a_code, np.int8), (self.a_addr, np.int64), (self.a_size, np.int64),
                           (self.a_stream, np.int64), (self.a_time, np.int64), (self.a_devfree, np.int64),
                           (self.a_has, np.uint16), (self.a_sid, np.int32)):
            new = np.zeros(cap, dtype=dtype)
            if old is not None and n:
                new[:n] = old[:n]
            arrays.append(new)
        (self.a_code, self.a_addr, self.a_size, self.a_stream, self.a_time, self.a_devfree, self.a_has,
         self.a_sid) = arrays
        self.code, self.addr, self.size, self.stream = self.a_code, self.a_addr, self.a_size, self.a_stream
        self.time_us, self.device_free, self.has, self.sid = self.a_time, self.a_devfree, self.a_has, self.a_sid
        self.cap = cap

    cdef void add(self, _Entry e, int moves_mask) except *:
        cdef Py_ssize_t i = self.n
        if e.code < 0:
            bail("trace entry without an action")
        if (moves_mask >> e.code) & 1 and (e.has & 0b110) != 0b110:
            bail("memory action without addr or size")
        if i == self.cap:
            self._alloc(self.cap * 2)
        self.code[i] = <signed char>e.code
        self.addr[i] = e.addr
        self.size[i] = e.size
        self.stream[i] = e.stream
        self.time_us[i] = e.time_us
        self.device_free[i] = e.device_free
        self.has[i] = <unsigned short>e.has
        self.sid[i] = e.sid
        if e.extras is not None:
            self.extras[i] = e.extras
        self.n = i + 1

    def columns(self):
        n = self.n
        return {"code": self.a_code[:n].copy(), "addr": self.a_addr[:n].copy(), "size": self.a_size[:n].copy(),
                "stream": self.a_stream[:n].copy(), "time_us": self.a_time[:n].copy(),
                "device_free": self.a_devfree[:n].copy(), "has": self.a_has[:n].copy(), "sid": self.a_sid[:n].copy(),
                "extras": self.extras}


cdef inline bint is_builder(object x):
    return type(x) is _Entry or type(x) is _Frames or type(x) is _Trace


@cython.final
cdef class _Reader:
    cdef object fh
    cdef bytearray buf
    cdef const unsigned char[::1] data
    cdef Py_ssize_t pos, end
    cdef long long base  # the file offset of buf[0]
    cdef long long frame_end  # the file offset where the current FRAME ends (-1: outside frames)
    cdef bint framed  # the file starts with a FRAME (protocol 4+ as Python writes it)
    cdef list stack, marks, memo
    cdef Py_ssize_t memo_len
    cdef long long file_size, built, max_built
    cdef object traces_list
    cdef dict actions, stack_index
    cdef list stacks, traces
    cdef set frozen
    cdef int moves_mask
    cdef list keys  # per field id, the key string last seen for it (the pickle's memoized keys: one object each)

    def __init__(self, fh, long long file_size, long long max_built, tuple actions, tuple moves):
        self.fh = fh
        self.buf = bytearray(CHUNK)
        self.data = self.buf
        self.pos = 0
        self.end = 0
        self.base = 0
        self.frame_end = -1
        self.framed = False
        self.stack = []
        self.marks = []
        self.memo = []
        self.memo_len = 0
        self.file_size = file_size
        self.built = 0
        self.max_built = max_built
        self.traces_list = None
        self.actions = {name: i for i, name in enumerate(actions)}
        self.moves_mask = 0
        for name in moves:
            self.moves_mask |= 1 << self.actions[name]
        self.stack_index = {}
        self.stacks = []
        self.traces = []
        self.frozen = set()
        self.keys = [None] * 9

    # ---- input ------------------------------------------------------------------------------------

    cdef inline int need(self, Py_ssize_t n) except -1:
        """At least ``n`` bytes from ``pos`` in the buffer (Unsupported at the end of the file, or where the
        bytes would run past the end of the current FRAME: CPython's Unpickler would then drop the rest of
        the frame and read on from the file, which no writer's pickle ever asks of it)."""
        if self.end - self.pos >= n and (self.frame_end < 0 or self.base + self.pos + n <= self.frame_end):
            return 0
        self.refill(n)
        return 0

    cdef void refill(self, Py_ssize_t n) except *:
        cdef Py_ssize_t have = self.end - self.pos
        cdef Py_ssize_t got
        if self.frame_end >= 0:
            if self.base + self.pos == self.frame_end:  # the frame is read: on from the file
                self.frame_end = -1
            elif self.base + self.pos + n > self.frame_end:
                bail("an opcode across the end of a FRAME")
        if have >= n:
            return
        if n > self.file_size:
            bail("a length past the end of the file")
        if n > len(self.buf):
            grown = bytearray(n + CHUNK)
            grown[:have] = self.buf[self.pos:self.end]
            self.data = None
            self.buf = grown
        elif have:
            self.data = None
            self.buf[:have] = self.buf[self.pos:self.end]
        self.data = None
        self.base += self.pos
        self.pos, self.end = 0, have
        view = memoryview(self.buf)
        while self.end < n:
            got = self.fh.readinto(view[self.end:])
            if not got:
                view.release()
                bail("the file ends in the middle of the data")
            self.end += got
        view.release()
        self.data = self.buf

    cdef inline unsigned int byte(self) except? 0:
        self.need(1)
        self.pos += 1
        return self.data[self.pos - 1]

    cdef inline unsigned long long uint_le(self, int n) except? 0:
        cdef unsigned long long v = 0
        cdef int k
        self.need(n)
        for k in range(n):
            v |= (<unsigned long long>self.data[self.pos + k]) << (8 * k)
        self.pos += n
        return v

    cdef object text(self, Py_ssize_t n):
        if n < 0 or n > self.file_size:
            bail("a length past the end of the file")
        self.need(n)
        cdef const unsigned char[::1] part = self.data[self.pos:self.pos + n]
        self.pos += n
        if n == 0:
            return ""
        return PyUnicode_DecodeUTF8(<const char*>&part[0], n, "surrogatepass")

    cdef object raw(self, Py_ssize_t n):
        if n < 0 or n > self.file_size:
            bail("a length past the end of the file")
        self.need(n)
        out = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return out

    # ---- the VM -----------------------------------------------------------------------------------

    cdef inline void count(self) except *:
        self.built += 1
        if self.built > self.max_built:
            bail("near the cap on containers")

    cdef Py_ssize_t mark_pop(self) except -1:
        if not self.marks:
            bail("no MARK")
        return self.marks.pop()

    cdef bint in_context(self, object container, object kind):
        """Is a new value an item for ``container`` (or a container of type ``kind``): the top item (an
        APPEND to follow) or the item below the innermost open MARK (an APPENDS batch)? A wrong guess only
        ever leads to Unsupported: a builder is refused wherever it was not meant to go."""
        cdef Py_ssize_t n = len(self.stack)
        cdef Py_ssize_t m
        if n and (self.stack[n - 1] is container or type(self.stack[n - 1]) is kind):
            return True
        if self.marks:
            m = self.marks[-1]
            if 0 < m <= n:
                below = self.stack[m - 1]
                return below is container or type(below) is kind
        return False

    cdef bint is_key_of(self, object owner_type, str key):
        """Is the top item the string ``key`` as a key set on a container of ``owner_type`` (a SETITEM or
        a SETITEMS batch)?"""
        cdef Py_ssize_t n = len(self.stack)
        cdef Py_ssize_t m
        if n < 2:
            return False
        top = self.stack[n - 1]
        if type(top) is not str or top != key:
            return False
        if self.marks and self.marks[-1] < n:
            m = self.marks[-1]
            if m > 0 and type(self.stack[m - 1]) is owner_type and (n - 1 - m) % 2 == 0:
                return True
        return type(self.stack[n - 2]) is owner_type

    cdef void memo_put(self, Py_ssize_t idx, object value) except *:
        if idx < 0 or idx > self.file_size:
            bail("memo index past the file")
        if type(value) is _Entry:
            if (<_Entry>value).memo >= 0:
                bail("an entry memoized twice")
            (<_Entry>value).memo = idx
        elif type(value) is _Frames:
            if (<_Frames>value).memo >= 0:
                bail("a frames list memoized twice")
            (<_Frames>value).memo = idx
        elif type(value) is _Trace:
            if (<_Trace>value).memo >= 0:
                bail("a trace memoized twice")
            (<_Trace>value).memo = idx
        cdef Py_ssize_t have = len(self.memo)
        if idx == have:
            self.memo.append(None)
        elif idx > have:
            self.memo.extend([None] * (idx + 1 - have))
        if self.memo[idx] is None:
            self.memo_len += 1
        self.memo[idx] = value

    cdef object memo_get(self, Py_ssize_t idx):
        if idx < 0 or idx >= len(self.memo):
            bail("memo index not set")
        value = self.memo[idx]
        if value is None or value is CONSUMED or is_builder(value):
            bail("memo reference to a trace entry or a slot never set")
        return value

    cdef int intern(self, list items) except -2:
        """The stack id of a frames list: lists holding the same frame objects are one stack."""
        cdef uint64_t h = <uint64_t>len(items)
        cdef Py_ssize_t k, n = len(items)
        for k in range(n):
            h = (h ^ <uint64_t><uintptr_t><void*>items[k]) * <uint64_t>0x100000001b3
        key = <long long><int64_t>h
        known = self.stack_index.get(key)
        if known is not None:
            for sid in known:
                other = <list>self.stacks[sid]
                if other is items:
                    return sid
                if len(other) == n:
                    for k in range(n):
                        if <void*>other[k] != <void*>items[k]:
                            break
                    else:
                        return sid
        sid = len(self.stacks)
        self.stacks.append(items)
        self.frozen.add(id(items))
        if known is None:
            self.stack_index[key] = [sid]
        else:
            known.append(sid)
        return sid

    cdef void set_entry(self, _Entry e, object key, object value) except *:
        cdef long long v
        cdef int fid, k, overflow = 0
        fid = -1
        for k in range(9):
            if self.keys[k] is key:
                fid = k
                break
        else:
            if type(key) is not str:
                bail("a trace entry key that is no string")
            found = FIELDS.get(key)
            if found is not None:
                fid = <int>found
                self.keys[fid] = key
        if fid < 0 or fid == F_CONTEXT or fid == F_FORWARD:
            if is_builder(value):
                bail("a builder as a value")
            if fid == F_CONTEXT and type(value) is not str:
                bail("compile_context not a string")
            if fid == F_FORWARD and type(value) is not list and type(value) is not tuple:
                bail("forward_frames not a list")
            if e.extras is None:
                e.extras = {}
            e.extras[key] = value
            return
        if fid == F_ACTION:
            if type(value) is not str:
                bail("action not a string")
            code = self.actions.get(value)
            if code is None:
                bail("unknown action")
            e.code = code
            e.has |= 1
            return
        if fid == F_FRAMES:
            if type(value) is _Frames:
                frames = <_Frames>value
                if frames.items is None:
                    bail("a frames list taken twice")
                e.sid = self.intern(frames.items)
                if frames.memo >= 0:
                    self.memo[frames.memo] = self.stacks[e.sid]
                frames.items = None
            elif type(value) is list:
                e.sid = self.intern(value)
            else:
                bail("frames not a list")
            e.has |= 1 << F_FRAMES
            return
        if type(value) is not int:
            bail("an integer field that is no int")
        v = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow:
            bail("an integer past int64")
        if fid == F_ADDR:
            if v < 0:
                bail("negative addr")
            e.addr = v
        elif fid == F_SIZE:
            if v < 0:
                bail("negative size")
            e.size = v
        elif fid == F_STREAM:
            e.stream = v
        elif fid == F_TIME:
            if v < 0 or v > TIME_US_MAX:
                bail("time_us out of range")
            e.time_us = v
        else:
            e.device_free = v
        e.has |= 1 << fid

    cdef void check_plain(self, list items) except *:
        for x in items:
            if is_builder(x):
                bail("a builder in a plain container")

    cdef void appends(self, object target, Py_ssize_t start) except *:
        """APPEND(S) of the items ``stack[start:]`` to ``target``; the items leave the stack."""
        cdef _Trace trace
        cdef _Entry entry
        cdef list frames
        cdef Py_ssize_t k, n = len(self.stack)
        cdef list stack = self.stack
        if type(target) is _Trace:
            trace = <_Trace>target
            for k in range(start, n):
                x = stack[k]
                if type(x) is not _Entry:
                    bail("a trace item that is no dict")
                entry = <_Entry>x
                trace.add(entry, self.moves_mask)
                if entry.memo >= 0:
                    self.memo[entry.memo] = CONSUMED
            PyList_SetSlice(stack, start, n, NULL)
            return
        if type(target) is _Frames:
            frames = (<_Frames>target).items
            if frames is None:
                bail("a frames list appended to after its entry took it")
            for k in range(start, n):
                x = stack[k]
                if is_builder(x):
                    bail("a builder in a frames list")
                frames.append(x)
            PyList_SetSlice(stack, start, n, NULL)
            return
        items = stack[start:]
        PyList_SetSlice(stack, start, n, NULL)
        if type(target) is not list:
            bail("APPEND to no list")
        if id(target) in self.frozen:
            bail("APPEND to a list read as a stack")
        if target is self.traces_list:
            for x in items:
                if type(x) is _Trace:
                    if (<_Trace>x).placed:
                        bail("a trace placed twice")
                    (<_Trace>x).placed = True
                elif is_builder(x):
                    bail("a builder in the traces list")
        else:
            self.check_plain(items)
        (<list>target).extend(items)

    cdef void setitems(self, object target, Py_ssize_t start) except *:
        """SETITEM(S) of the pairs ``stack[start:]`` on ``target``; the pairs leave the stack."""
        cdef Py_ssize_t k, n = len(self.stack)
        cdef list stack = self.stack
        if (n - start) % 2:
            bail("odd SETITEMS")
        if type(target) is _Entry:
            for k in range(start, n, 2):
                self.set_entry(<_Entry>target, stack[k], stack[k + 1])
            PyList_SetSlice(stack, start, n, NULL)
            return
        items = stack[start:]
        PyList_SetSlice(stack, start, n, NULL)
        if type(target) is not dict:
            bail("SETITEM on no dict")
        self.check_plain(items)
        for k in range(0, len(items), 2):
            (<dict>target)[items[k]] = items[k + 1]

    cdef list pop_to_mark(self):
        cdef Py_ssize_t m = self.mark_pop()
        if m > len(self.stack):
            bail("MARK past the stack")
        items = self.stack[m:]
        del self.stack[m:]
        return items

    cdef object pop(self):
        if not self.stack or (self.marks and self.marks[-1] >= len(self.stack)):
            bail("stack underflow")
        return self.stack.pop()

    cdef object new_list(self):
        self.count()
        if self.traces_list is not None and self.in_context(self.traces_list, None):
            trace = _Trace()
            self.traces.append(trace)
            return trace
        if self.is_key_of(_Entry, "frames"):
            return _Frames.__new__(_Frames)
        if (self.traces_list is None and self.stack and type(self.stack[0]) is dict
                and self.is_key_of(dict, "device_traces")
                and ((len(self.marks) == 1 and self.marks[0] == 1) or (not self.marks and len(self.stack) == 2))):
            self.traces_list = []
            return self.traces_list
        return []

    cdef object new_dict(self):
        self.count()
        if self.in_context(None, _Trace):
            return _Entry.__new__(_Entry)
        return {}

    def run(self):
        cdef unsigned int op
        cdef long long v
        cdef Py_ssize_t n
        cdef int proto_seen = 0
        first = True
        while True:
            op = self.byte()
            if first:
                if op != 0x80:
                    bail("no PROTO first")
                first = False
            if op == 0x80:  # PROTO
                v = self.byte()
                if v > 5 or (proto_seen == 0 and v < 2):
                    bail("protocol outside 2..5")
                proto_seen = 1
            elif op == 0x95:  # FRAME
                if self.base + self.pos == 3:
                    self.framed = True
                if not self.framed:
                    bail("a FRAME in a pickle that does not start with one")
                v = <long long>self.uint_le(8)  # negative: a length past int64, no frame of this file
                if v < 0 or v > self.file_size - (self.base + self.pos):
                    bail("FRAME past the file")
                n = <Py_ssize_t>v
                if self.frame_end < 0 or self.base + self.pos == self.frame_end:
                    self.frame_end = self.base + self.pos + n
                elif self.base + self.pos + n > self.frame_end:
                    bail("a FRAME past the end of the FRAME it lies in")
                if n > (1 << 18) and self.built + n > self.max_built:
                    bail("a long FRAME near the cap")
            elif op == 0x28:  # MARK
                if len(self.marks) >= MAX_MARKS:
                    bail("nested too deeply")
                self.marks.append(len(self.stack))
            elif op == 0x7d:  # EMPTY_DICT
                self.stack.append(self.new_dict())
            elif op == 0x5d:  # EMPTY_LIST
                self.stack.append(self.new_list())
            elif op == 0x29:  # EMPTY_TUPLE
                self.stack.append(())
            elif op == 0x94:  # MEMOIZE
                if not self.stack:
                    bail("MEMOIZE on an empty stack")
                self.memo_put(self.memo_len, self.stack[-1])
            elif op == 0x71:  # BINPUT
                n = self.byte()
                if not self.stack:
                    bail("PUT on an empty stack")
                self.memo_put(n, self.stack[-1])
            elif op == 0x72:  # LONG_BINPUT
                n = <Py_ssize_t>self.uint_le(4)
                if not self.stack:
                    bail("PUT on an empty stack")
                self.memo_put(n, self.stack[-1])
            elif op == 0x68:  # BINGET
                self.stack.append(self.memo_get(self.byte()))
            elif op == 0x6a:  # LONG_BINGET
                self.stack.append(self.memo_get(<Py_ssize_t>self.uint_le(4)))
            elif op == 0x8c:  # SHORT_BINUNICODE
                self.stack.append(self.text(self.byte()))
            elif op == 0x58:  # BINUNICODE
                self.stack.append(self.text(<Py_ssize_t>self.uint_le(4)))
            elif op == 0x8d:  # BINUNICODE8
                v = <long long>self.uint_le(8)
                self.stack.append(self.text(<Py_ssize_t>v if 0 <= v <= self.file_size else -1))
            elif op == 0x43:  # SHORT_BINBYTES
                self.stack.append(self.raw(self.byte()))
            elif op == 0x42:  # BINBYTES
                self.stack.append(self.raw(<Py_ssize_t>self.uint_le(4)))
            elif op == 0x4b:  # BININT1
                self.stack.append(<long>self.byte())
            elif op == 0x4d:  # BININT2
                self.stack.append(<long>self.uint_le(2))
            elif op == 0x4a:  # BININT
                self.stack.append(<long>(<int>(<unsigned int>self.uint_le(4))))
            elif op == 0x8a:  # LONG1
                n = self.byte()
                self.stack.append(self.long_le(n))
            elif op == 0x8b:  # LONG4
                v = <long long>(<int>(<unsigned int>self.uint_le(4)))
                if v < 0 or v > self.file_size:
                    bail("LONG4 length")
                self.stack.append(self.long_le(<Py_ssize_t>v))
            elif op == 0x47:  # BINFLOAT
                self.stack.append(self.binfloat())
            elif op == 0x4e:  # NONE
                self.stack.append(None)
            elif op == 0x88:  # NEWTRUE
                self.stack.append(True)
            elif op == 0x89:  # NEWFALSE
                self.stack.append(False)
            elif op == 0x85 or op == 0x86 or op == 0x87:  # TUPLE1..3
                n = op - 0x84
                if len(self.stack) < n or (self.marks and self.marks[-1] > len(self.stack) - n):
                    bail("stack underflow")
                items = self.stack[len(self.stack) - n:]
                del self.stack[len(self.stack) - n:]
                self.check_plain(items)
                self.count()
                self.stack.append(tuple(items))
            elif op == 0x74:  # TUPLE
                items = self.pop_to_mark()
                self.check_plain(items)
                self.count()
                self.stack.append(tuple(items))
            elif op == 0x61:  # APPEND
                n = len(self.stack)
                if n < 2 or (self.marks and self.marks[-1] >= n - 1):
                    bail("APPEND without a list")
                self.appends(self.stack[n - 2], n - 1)
            elif op == 0x65:  # APPENDS
                n = self.mark_pop()
                if n < 1 or n > len(self.stack):
                    bail("APPENDS without a list")
                self.appends(self.stack[n - 1], n)
            elif op == 0x73:  # SETITEM
                n = len(self.stack)
                if n < 3 or (self.marks and self.marks[-1] >= n - 2):
                    bail("SETITEM without a dict")
                self.setitems(self.stack[n - 3], n - 2)
            elif op == 0x75:  # SETITEMS
                n = self.mark_pop()
                if n < 1 or n > len(self.stack):
                    bail("SETITEMS without a dict")
                self.setitems(self.stack[n - 1], n)
            elif op == 0x2e:  # STOP
                return self.finish()
            else:
                bail(f"opcode {op:#x}")

    cdef object long_le(self, Py_ssize_t n):
        cdef unsigned long long u
        if n == 0:
            return 0
        if n <= 8:
            u = self.uint_le(<int>n)
            if n < 8 and (u >> (8 * n - 1)) & 1:  # negative: the bits above it are ones
                u |= (~(<unsigned long long>0)) << (8 * n)
            return PyLong_FromLongLong(<long long>u)
        return int.from_bytes(self.raw(n), "little", signed=True)

    cdef object binfloat(self):
        import struct
        return struct.unpack(">d", self.raw(8))[0]

    cdef object finish(self):
        if len(self.stack) != 1 or self.marks:
            bail("STOP with more than one value")
        value = self.stack[0]
        if is_builder(value):
            bail("a builder at the top")
        # what follows STOP: only NUL padding, as the reference allows
        while True:
            if self.pos < self.end:
                if bytes(self.data[self.pos:self.end]).strip(b"\x00"):
                    bail("trailing bytes")
                self.pos = self.end
            chunk = self.fh.read(CHUNK)
            if not chunk:
                break
            if chunk.strip(b"\x00"):
                bail("trailing bytes")
        for trace in self.traces:
            if not (<_Trace>trace).placed:
                bail("a trace outside device_traces")
        if type(value) is dict and self.traces_list is not None and value.get("device_traces") is not self.traces_list:
            bail("device_traces replaced")
        return value


def read(fh, long long file_size, long long max_containers, tuple actions, tuple moves):
    """The plain data the pickle in ``fh`` holds, each device trace whose entries are read as columns
    taken out as a dict of columns: (value, the distinct stacks, the device_traces list, [(index in it,
    columns)]), the slots of those traces left None for the caller to fill (:mod:`memgate.readers.snapshot_columns`).
    Unsupported where the pure-Python reader must decide."""
    reader = _Reader(fh, file_size, max_containers - MARGIN, actions, moves)
    value = reader.run()
    placed = []
    if reader.traces_list is not None:
        lst = reader.traces_list
        for k in range(len(lst)):
            if type(lst[k]) is _Trace:
                placed.append((k, (<_Trace>lst[k]).columns()))
                lst[k] = None
    return value, reader.stacks, reader.traces_list, placed
