# cython: language_level=3, boundscheck=True, wraparound=True, initializedcheck=True, cdivision=False
"""The compiled snapshot reader: a pickle VM for plain data that turns device-trace entries into columns.

It reads the file in chunks and walks its opcodes as CPython's Unpickler would, building the same
objects, except where a snapshot's trace entries lie (``root["device_traces"][d][i]``): an entry dict
is never built, its values go straight into typed columns, and its frames list becomes a stack id
(lists holding the same frame objects are one stack, decoded once). Everything it does not know, or
that the pure-Python reader might judge otherwise (a global, an opcode it does not read, a value the
schema refuses, a memo index past the file, a container count near the cap), raises ``Unsupported``:
the caller then reads the file with :mod:`memgate.readers.safepickle`, whose result or one-line error
is the answer. So the compiled reader only ever says yes to what the reference says yes to, with the
same value.

Most entries never reach the VM: ``_Reader.fast_entry`` reads an entry in the shape a pickler writes it
(MEMOIZE, MARK, keys and actions as memo references, integers, a frames list of memo references, short
strings it has met, SETITEMS) straight from the buffer into the columns, and leaves anything else (or an
entry cut by the buffer's or a FRAME's end) to the VM from its first byte, having changed nothing.

Every byte of the file is read through a bounds-checked typed memoryview (``boundscheck=True``). The fast
path names objects by borrowed pointers, only while a list (the memo, ``keys``, ``pinned``) holds them,
in fixed-size C arrays whose indexes it checks before each write.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_FromLongLong
from cpython.ref cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeUTF8


cdef extern from "Python.h":
    int PyList_SetSlice(object lst, Py_ssize_t low, Py_ssize_t high, void* itemlist) except -1  # NULL: delete
    const char* utf8_of "PyUnicode_AsUTF8AndSize"(object text, Py_ssize_t* size)  # NULL, an error set: none
    void PyErr_Clear()
from libc.stdint cimport uint64_t, int64_t, uintptr_t

cimport cython

import numpy as np


class Unsupported(Exception):
    """The compiled reader does not take this file: the pure-Python reader decides."""


cdef object CONSUMED = object()  # a memo slot of a trace entry turned into columns: no BINGET may name it
cdef long long INT64_MAX = 9223372036854775807
cdef long long TIME_US_MAX = 9223372036854775  # the schema's maximum for time_us
cdef Py_ssize_t CHUNK = 1 << 22
# A trace's columns, in _Trace's order (_Trace._arrays), and their types
_COLUMNS = ("code", "addr", "size", "stream", "time_us", "device_free", "has", "sid", "xid")
_DTYPES = (np.int8, np.int64, np.int64, np.int64, np.int64, np.int64, np.uint16, np.int32, np.int32)
cdef Py_ssize_t MAX_MARKS = 100000
cdef long long MARGIN = 1024  # containers: near the cap the reference's own count decides
# The fast path (``_Reader.fast_entry``) reads an entry of at most this many frames and extra keys; a
# longer one goes the generic way.
DEF MAX_FAST_FRAMES = 512
DEF MAX_EXTRAS = 16
DEF RECENT = 4096
DEF TEXTS = 8  # short strings a writer repeats as new objects (compile_context "N/A"), met by their bytes
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
    cdef object a_code, a_addr, a_size, a_stream, a_time, a_devfree, a_has, a_sid, a_xid
    cdef signed char[::1] code
    cdef long long[::1] addr, size, stream, time_us, device_free
    cdef unsigned short[::1] has
    cdef int[::1] sid
    cdef int[::1] xid  # per entry, its set of keys outside the columns (an index into the reader's extra_sets), -1: none

    def __cinit__(self):
        self.memo = -1
        self._alloc(64)

    cdef void _alloc(self, Py_ssize_t cap) except *:
        """Give every column room for ``cap`` entries, in place where it can: ``ndarray.resize`` reallocs
        (a large block moves by remapping its pages, not copying them), so growing never holds a column
        twice, as a new array and a copy would. numpy does not refuse to resize an array whose buffer is
        exported: no typed view of a column may outlive a put() (only put() writes through them)."""
        self._release()
        if self.a_code is None:
            (self.a_code, self.a_addr, self.a_size, self.a_stream, self.a_time, self.a_devfree, self.a_has,
             self.a_sid, self.a_xid) = [np.zeros(cap, dtype=dtype) for dtype in _DTYPES]
        else:
            for arr in self._arrays():
                arr.resize(cap, refcheck=False)  # only this trace holds them, and no view is held now
        self._view()
        self.cap = cap

    cdef void _release(self):
        """Let go of the typed views (an array with views exported cannot be resized)."""
        self.code = None
        self.addr = self.size = self.stream = self.time_us = self.device_free = None
        self.has = None
        self.sid = self.xid = None

    cdef void _view(self):
        self.code, self.addr, self.size, self.stream = self.a_code, self.a_addr, self.a_size, self.a_stream
        self.time_us, self.device_free, self.has, self.sid = self.a_time, self.a_devfree, self.a_has, self.a_sid
        self.xid = self.a_xid

    cdef list _arrays(self):
        return [self.a_code, self.a_addr, self.a_size, self.a_stream, self.a_time, self.a_devfree, self.a_has,
                self.a_sid, self.a_xid]

    cdef void put(self, int code, long long addr, long long size, long long stream, long long time_us,
                  long long device_free, int has, int sid, int xid, int moves_mask) except *:
        cdef Py_ssize_t i = self.n
        if code < 0:
            bail("trace entry without an action")
        if (moves_mask >> code) & 1 and (has & 0b110) != 0b110:
            bail("memory action without addr or size")
        if i == self.cap:
            self._alloc(self.cap * 2)
        self.code[i] = <signed char>code
        self.addr[i] = addr
        self.size[i] = size
        self.stream[i] = stream
        self.time_us[i] = time_us
        self.device_free[i] = device_free
        self.has[i] = <unsigned short>has
        self.sid[i] = sid
        self.xid[i] = xid
        self.n = i + 1

    def columns(self):
        """The columns, cut to the entries read (in place: no copy), handed over: the trace keeps none."""
        cdef Py_ssize_t n = self.n
        self._release()
        arrays = self._arrays()
        for arr in arrays:
            arr.resize(n, refcheck=False)
        self.a_code = self.a_addr = self.a_size = self.a_stream = self.a_time = None
        self.a_devfree = self.a_has = self.a_sid = self.a_xid = None
        self.n = self.cap = 0
        return dict(zip(_COLUMNS, arrays))


cdef inline bint is_builder(object x) noexcept:
    return type(x) is _Entry or type(x) is _Frames or type(x) is _Trace


cdef inline bint utf8_ok(object text) noexcept:
    """Can UTF-8 hold this str (no lone surrogate)? What the schema checks of a string column does."""
    if utf8_of(text, NULL) == NULL:
        PyErr_Clear()
        return False
    return True


cdef inline uint64_t ptr_hash(PyObject** items, Py_ssize_t n) noexcept:
    """A hash of a sequence of objects by identity (FNV-1a over their addresses)."""
    cdef uint64_t h = <uint64_t>n
    cdef Py_ssize_t k
    for k in range(n):
        h = (h ^ <uint64_t><uintptr_t>items[k]) * <uint64_t>0x100000001b3
    return h


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
    cdef object a_busy
    cdef unsigned char[::1] busy  # per memo slot, 1 where a BINGET may not take it (unset, spent, being built)
    cdef Py_ssize_t memo_len
    cdef long long file_size, built, max_built
    cdef object traces_list
    cdef dict actions, stack_index
    cdef list stacks, traces
    cdef set frozen
    cdef int moves_mask
    cdef list keys  # per field id, the key string last seen for it (the pickle's memoized keys: one object each)
    cdef list extra_sets, extra_kv  # the distinct sets of keys outside the columns, as dicts and as (k, v, ...)
    cdef dict extra_index  # hash of an extras set's objects -> [its indexes in extra_sets]
    cdef public long long fast_taken  # entries the fast path read (the tests' check that it is used)
    cdef long direct_depth  # len(marks) of the APPENDS batch whose entries went into its trace already, -1: none
    # The fast path's caches, by object identity: each names an object held by ``keys`` or ``pinned`` (a
    # pointer to an object that was freed could be taken by another one).
    cdef list pinned
    cdef PyObject* keyp[9]
    cdef PyObject* xkeyp[8]  # keys outside the fields
    cdef int n_xkeys
    cdef PyObject* actp[16]  # action strings, with their codes
    cdef int actcode[16]
    cdef int n_act
    cdef list texts  # [(UTF-8 bytes, str)], at most TEXTS: one str object for each, the entries' values share it
    cdef uint64_t recent_hash[RECENT]  # stacks met lately, by ptr_hash slot: the hash and the stack id (-1: none)
    cdef int recent_sid[RECENT]

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
        self.a_busy = np.ones(1 << 16, dtype=np.uint8)
        self.busy = self.a_busy
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
        self.extra_sets = []
        self.extra_kv = []
        self.extra_index = {}
        self.direct_depth = -1
        self.pinned = []
        for k in range(9):
            self.keyp[k] = NULL
        self.n_xkeys = 0
        self.n_act = 0
        self.texts = []
        for k in range(RECENT):
            self.recent_sid[k] = -1

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

    cdef Py_ssize_t mark_pop(self, bint appends=False) except -1:
        if not self.marks:
            bail("no MARK")
        if len(self.marks) == self.direct_depth:  # the batch whose entries are in their trace already
            if not appends:
                bail("trace entries in a batch that is not appended to their trace")
            self.direct_depth = -1
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
        if idx >= len(self.memo) or self.memo[idx] is None:
            self.memo_len += 1
        self.memo_set(idx, value)

    cdef void memo_set(self, Py_ssize_t idx, object value) except *:
        """Memo slot ``idx`` holds ``value`` (the memo grown with unset slots up to it), and ``busy`` says
        whether a BINGET may take it."""
        cdef Py_ssize_t have = len(self.memo)
        if idx == have:
            self.memo.append(None)
        elif idx > have:
            self.memo.extend([None] * (idx + 1 - have))
        if idx >= self.busy.shape[0]:
            grown = np.ones(max(2 * self.busy.shape[0], idx + 1), dtype=np.uint8)
            grown[:self.busy.shape[0]] = self.a_busy
            self.a_busy = grown
            self.busy = grown
        self.memo[idx] = value
        self.busy[idx] = value is None or value is CONSUMED or is_builder(value)

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
            h = (h ^ <uint64_t><uintptr_t>PyList_GET_ITEM(items, k)) * <uint64_t>0x100000001b3
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

    cdef int intern_ptrs(self, PyObject** items, Py_ssize_t n) except -2:
        """The stack id of the frames ``items[:n]`` (as :meth:`intern`), a list made only for a new stack."""
        cdef Py_ssize_t k
        cdef list other
        cdef int found
        cdef uint64_t h = ptr_hash(items, n)
        cdef Py_ssize_t slot = <Py_ssize_t>(h % RECENT)
        if self.recent_hash[slot] == h and self.recent_sid[slot] >= 0:  # most entries: a stack met lately
            other = <list>self.stacks[self.recent_sid[slot]]
            if len(other) == n:
                for k in range(n):
                    if PyList_GET_ITEM(other, k) != items[k]:
                        break
                else:
                    return self.recent_sid[slot]
        found = -1
        known = self.stack_index.get(<long long><int64_t>h)
        if known is not None:
            for sid in known:
                other = <list>self.stacks[sid]
                if len(other) == n:
                    for k in range(n):
                        if PyList_GET_ITEM(other, k) != items[k]:
                            break
                    else:
                        found = sid
                        break
        if found < 0:
            found = self.intern([<object>items[k] for k in range(n)])
        self.recent_hash[slot] = h
        self.recent_sid[slot] = found
        return found

    cdef int intern_extras(self, PyObject** kv, Py_ssize_t n) except -2:
        """The index in ``extra_sets`` of the keys outside the columns ``kv[:n]`` (key, value, key, value...
        in the entry's order; entries holding the same objects share one dict)."""
        cdef Py_ssize_t k
        cdef tuple other
        cdef uint64_t h = ptr_hash(kv, n)
        key = <long long><int64_t>h
        known = self.extra_index.get(key)
        if known is not None:
            for xid in known:
                other = <tuple>self.extra_kv[xid]
                if len(other) == n:
                    for k in range(n):
                        if <PyObject*>other[k] != kv[k]:
                            break
                    else:
                        return xid
        items = tuple([<object>kv[k] for k in range(n)])
        xid = len(self.extra_sets)
        self.extra_kv.append(items)
        self.extra_sets.append({items[k]: items[k + 1] for k in range(0, n, 2)})
        if known is None:
            self.extra_index[key] = [xid]
        else:
            known.append(xid)
        return xid

    cdef void add_entry(self, _Trace trace, _Entry e) except *:
        """An entry the VM read, into its trace's columns; its memo slot is spent."""
        cdef PyObject* kv[2 * MAX_EXTRAS]
        cdef Py_ssize_t n = 0
        cdef int xid = -1
        if e.extras is not None:
            if len(e.extras) > MAX_EXTRAS:
                bail("too many keys outside the columns")
            for key, value in e.extras.items():
                kv[n] = <PyObject*>key
                kv[n + 1] = <PyObject*>value
                n += 2
            xid = self.intern_extras(kv, n)
        trace.put(e.code, e.addr, e.size, e.stream, e.time_us, e.device_free, e.has, e.sid, xid, self.moves_mask)
        if e.memo >= 0:
            self.memo_set(e.memo, CONSUMED)

    cdef object fast_trace(self):
        """The trace whose APPENDS batch an EMPTY_DICT here starts an entry of, where the fast path may read
        it: the item below the innermost MARK is a trace and those above it are entries, which go into
        the trace now, in order, as its APPENDS would put them (the batch must then end in that APPENDS:
        ``mark_pop`` refuses any other end). None: the generic VM reads it."""
        cdef Py_ssize_t k, m, n = len(self.stack)
        if not self.marks:
            return None
        m = self.marks[-1]
        if m < 1 or m > n or type(self.stack[m - 1]) is not _Trace:
            return None
        if self.direct_depth >= 0 and self.direct_depth != len(self.marks):
            return None
        for k in range(m, n):
            if type(self.stack[k]) is not _Entry:
                return None
        trace = self.stack[m - 1]
        self.direct_depth = len(self.marks)
        if n > m:
            self.appends(trace, m)
        return trace

    cdef inline Py_ssize_t memo_ref(self, Py_ssize_t* pp, Py_ssize_t lim, Py_ssize_t nmemo) except -2:
        """The memo index a BINGET or LONG_BINGET at ``pp[0]`` names (``pp[0]`` moved past it); -1 where
        the opcode is another, runs past ``lim`` or names a slot not set before the entry."""
        cdef Py_ssize_t p = pp[0]
        cdef Py_ssize_t idx
        if p >= lim:
            return -1
        if self.data[p] == 0x68:  # BINGET
            if p + 2 > lim:
                return -1
            idx = self.data[p + 1]
            p += 2
        elif self.data[p] == 0x6a:  # LONG_BINGET
            if p + 5 > lim:
                return -1
            idx = <Py_ssize_t>(self.data[p + 1] | (<unsigned int>self.data[p + 2] << 8)
                               | (<unsigned int>self.data[p + 3] << 16) | (<uint64_t>self.data[p + 4] << 24))
            p += 5
        else:
            return -1
        if idx >= nmemo:
            return -1
        pp[0] = p
        return idx

    cdef inline Py_ssize_t plain_ref(self, Py_ssize_t* pp, Py_ssize_t lim, Py_ssize_t nmemo) except -2:
        """The memo index of a reference at ``pp[0]`` where the VM's BINGET would take what it names (a
        plain value, not a slot never set or spent, not an object being built); -1 otherwise."""
        cdef Py_ssize_t idx = self.memo_ref(pp, lim, nmemo)
        if idx < 0:
            return -1
        if self.busy[idx]:  # (not the object's own type: most frames referenced are not in the cache)
            return -1
        return idx

    cdef inline PyObject* object_at(self, Py_ssize_t idx) noexcept:
        """The memo's object at ``idx`` (borrowed), NULL for -1."""
        return NULL if idx < 0 else PyList_GET_ITEM(self.memo, idx)

    cdef bint fast_entry(self, _Trace trace) except -1:
        """A trace entry read straight from the buffer into ``trace``'s columns, without the VM's stack
        (``pos`` just past its EMPTY_DICT). True where it was read (``pos`` past its SETITEMS); False, with
        nothing changed, where it is not in the shape a pickler writes a snapshot's entry in (MEMOIZE, MARK,
        keys as memo references, the values of the columns' types, a frames list of memo references,
        SETITEMS), or runs past the buffer or the current FRAME: the generic VM then reads it from its
        EMPTY_DICT. The values are checked as :meth:`set_entry` checks them, and anything it would refuse
        goes the generic way, which refuses it."""
        cdef Py_ssize_t p = self.pos
        cdef Py_ssize_t lim = self.end
        cdef Py_ssize_t nmemo = len(self.memo)
        cdef Py_ssize_t k, nfr = 0, nkv = 0
        cdef unsigned int op, nb
        cdef uint64_t u
        cdef long long v
        cdef int fid, code = -1, has = 0, sid = -1, xid = -1
        cdef long long addr = 0, size = 0, stream = 0, time_us = 0, devfree = 0
        cdef PyObject* key
        cdef PyObject* obj
        cdef PyObject* listed = NULL  # a frames value given as a memo reference to a list
        cdef PyObject* frames[MAX_FAST_FRAMES]
        cdef PyObject* kv[2 * MAX_EXTRAS]
        cdef PyObject* texts[MAX_EXTRAS]  # the values written in place, in order, and where the frames list's slot is
        cdef Py_ssize_t ntext = 0, frames_at = -1
        cdef bint inline_frames = False
        if self.frame_end >= 0 and self.frame_end - self.base < lim:
            lim = <Py_ssize_t>(self.frame_end - self.base)
        if nmemo != self.memo_len or len(self.marks) + 2 > MAX_MARKS or self.built + 2 > self.max_built:
            return False
        if p + 2 > lim or self.data[p] != 0x94 or self.data[p + 1] != 0x28:  # MEMOIZE MARK
            return False
        p += 2
        while True:
            if p >= lim:
                return False
            if self.data[p] == 0x75:  # SETITEMS
                p += 1
                break
            key = self.object_at(self.plain_ref(&p, lim, nmemo))
            if key == NULL:
                return False
            fid = -2
            for k in range(9):
                if self.keyp[k] == key:
                    fid = k
                    break
            else:
                for k in range(self.n_xkeys):
                    if self.xkeyp[k] == key:
                        fid = -1
                        break
                else:
                    return False  # a key not seen yet: the generic way learns it
            if fid >= 0 and has & (1 << fid):
                return False  # a key twice
            if p >= lim:
                return False
            op = self.data[p]
            if fid == F_ACTION:
                obj = self.object_at(self.plain_ref(&p, lim, nmemo))
                if obj == NULL:
                    return False
                for k in range(self.n_act):
                    if self.actp[k] == obj:
                        code = self.actcode[k]
                        break
                else:
                    return False
                has |= 1
            elif fid == F_FRAMES:
                if op == 0x5d:  # EMPTY_LIST, MEMOIZE, then MARK refs APPENDS, or ref APPEND, or nothing
                    if p + 2 > lim or self.data[p + 1] != 0x94:
                        return False
                    p += 2
                    frames_at = ntext
                    if p < lim and self.data[p] == 0x28:
                        p += 1
                        while True:
                            if p >= lim:
                                return False
                            if self.data[p] == 0x65:  # APPENDS
                                p += 1
                                break
                            if nfr == MAX_FAST_FRAMES:
                                return False
                            obj = self.object_at(self.plain_ref(&p, lim, nmemo))
                            if obj == NULL:
                                return False
                            frames[nfr] = obj
                            nfr += 1
                    else:  # one frame (a reference, APPEND), or none (the next key follows)
                        k = p
                        obj = self.object_at(self.plain_ref(&k, lim, nmemo))
                        if obj != NULL and k < lim and self.data[k] == 0x61:  # APPEND
                            p = k + 1
                            frames[0] = obj
                            nfr = 1
                    inline_frames = True
                else:
                    obj = self.object_at(self.plain_ref(&p, lim, nmemo))
                    if obj == NULL or type(<object>obj) is not list:
                        return False
                    listed = obj
                has |= 1 << F_FRAMES
            elif F_ADDR <= fid <= F_DEVFREE:
                if op == 0x4b:  # BININT1
                    if p + 2 > lim:
                        return False
                    v = self.data[p + 1]
                    p += 2
                elif op == 0x4d:  # BININT2
                    if p + 3 > lim:
                        return False
                    v = self.data[p + 1] | (<long long>self.data[p + 2] << 8)
                    p += 3
                elif op == 0x4a:  # BININT
                    if p + 5 > lim:
                        return False
                    v = <int>(<unsigned int>(self.data[p + 1] | (<unsigned int>self.data[p + 2] << 8)
                                             | (<unsigned int>self.data[p + 3] << 16)
                                             | (<unsigned int>self.data[p + 4] << 24)))
                    p += 5
                elif op == 0x8a:  # LONG1 of at most 8 bytes
                    if p + 2 > lim:
                        return False
                    nb = self.data[p + 1]
                    if nb > 8 or p + 2 + nb > lim:
                        return False
                    u = 0
                    for k in range(nb):
                        u |= (<uint64_t>self.data[p + 2 + k]) << (8 * k)
                    if 0 < nb < 8 and (u >> (8 * nb - 1)) & 1:
                        u |= (~(<uint64_t>0)) << (8 * nb)
                    v = <long long>u
                    p += 2 + nb
                else:
                    return False
                if fid == F_ADDR:
                    if v < 0:
                        return False
                    addr = v
                elif fid == F_SIZE:
                    if v < 0:
                        return False
                    size = v
                elif fid == F_STREAM:
                    stream = v
                elif fid == F_TIME:
                    if v < 0 or v > TIME_US_MAX:
                        return False
                    time_us = v
                else:
                    devfree = v
                has |= 1 << fid
            else:  # a key outside the columns: its value a memo reference, or None
                if op == 0x4e:  # NONE
                    obj = <PyObject*>None
                    p += 1
                elif op == 0x8c:  # SHORT_BINUNICODE, MEMOIZE: a string met before, by its bytes
                    if p + 2 > lim or ntext == MAX_EXTRAS:
                        return False
                    nb = self.data[p + 1]
                    if p + 3 + nb > lim or self.data[p + 2 + nb] != 0x94:
                        return False
                    obj = self.known_text(p + 2, nb)
                    if obj == NULL:
                        return False
                    texts[ntext] = obj
                    ntext += 1
                    p += 3 + nb
                else:
                    obj = self.object_at(self.plain_ref(&p, lim, nmemo))
                    if obj == NULL:
                        return False
                if fid == F_CONTEXT and (type(<object>obj) is not str or not utf8_ok(<object>obj)):
                    return False
                if fid == F_FORWARD and type(<object>obj) is not list and type(<object>obj) is not tuple:
                    return False
                if nkv == 2 * MAX_EXTRAS:
                    return False
                for k in range(0, nkv, 2):
                    if kv[k] == key:
                        return False  # a key twice
                kv[nkv] = key
                kv[nkv + 1] = obj
                nkv += 2
        # Read whole: into the columns, the memo slots (the entry's spent, its frames list's the stack) and
        # the container count as the VM would have left them.
        if inline_frames:
            sid = self.intern_ptrs(frames, nfr)
        elif listed != NULL:
            sid = self.intern(<list>listed)
        if nkv:
            xid = self.intern_extras(kv, nkv)
        trace.put(code, addr, size, stream, time_us, devfree, has, sid, xid, self.moves_mask)
        # the slots in the order of their MEMOIZEs: the entry's, then its strings and frames list as they came
        self.memo_set(nmemo, CONSUMED)
        self.built += 1
        for k in range(ntext + 1):
            if k == frames_at:
                self.memo_set(len(self.memo), self.stacks[sid])
                self.built += 1
            if k < ntext:
                self.memo_set(len(self.memo), <object>texts[k])
        self.memo_len = len(self.memo)
        self.pos = p
        self.fast_taken += 1
        return True

    cdef PyObject* known_text(self, Py_ssize_t at, Py_ssize_t n) noexcept:
        """The str of ``texts`` whose UTF-8 bytes are the buffer's ``n`` bytes at ``at`` (borrowed), or NULL."""
        cdef Py_ssize_t j, k
        cdef bytes raw
        cdef const char* c
        for j in range(len(self.texts)):
            raw = <bytes>(<tuple>self.texts[j])[0]
            if PyBytes_GET_SIZE(raw) != n:
                continue
            c = PyBytes_AS_STRING(raw)
            for k in range(n):
                if <unsigned char>c[k] != self.data[at + k]:
                    break
            else:
                return <PyObject*>(<tuple>self.texts[j])[1]
        return NULL

    cdef object canonical_text(self, object value):
        """``value``, or the equal str of ``texts`` (learnt here: a short string a trace entry holds)."""
        cdef tuple known
        for known in self.texts:
            if known[1] == value:
                return known[1]
        raw = (<str>value).encode("utf-8", "surrogatepass")
        if len(self.texts) < TEXTS and len(raw) < 256:
            self.texts.append((raw, value))
        return value

    cdef void learn(self, object obj, int code) except *:
        """Name ``obj`` to the fast path: an action string of ``code``, or (-1) a key outside the fields."""
        cdef int k
        if code >= 0:
            for k in range(self.n_act):
                if self.actp[k] == <PyObject*>obj:
                    return
            if self.n_act < 16:
                self.pinned.append(obj)
                self.actp[self.n_act] = <PyObject*>obj
                self.actcode[self.n_act] = code
                self.n_act += 1
            return
        for k in range(self.n_xkeys):
            if self.xkeyp[k] == <PyObject*>obj:
                return
        if self.n_xkeys < 8:
            self.pinned.append(obj)
            self.xkeyp[self.n_xkeys] = <PyObject*>obj
            self.n_xkeys += 1

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
                self.keyp[fid] = <PyObject*>key
            else:
                self.learn(key, -1)
        if fid < 0 or fid == F_CONTEXT or fid == F_FORWARD:
            if is_builder(value):
                bail("a builder as a value")
            if fid == F_CONTEXT and type(value) is not str:
                bail("compile_context not a string")
            if fid == F_CONTEXT and not utf8_ok(value):
                bail("compile_context not UTF-8 text")
            if fid == F_FORWARD and type(value) is not list and type(value) is not tuple:
                bail("forward_frames not a list")
            if type(value) is str:
                value = self.canonical_text(value)
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
            self.learn(value, <int>code)
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
                    self.memo_set(frames.memo, self.stacks[e.sid])
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
                self.add_entry(trace, entry)
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
                trace = self.fast_trace()
                if trace is None or not self.fast_entry(<_Trace>trace):
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
                n = self.mark_pop(True)
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


def read(fh, long long file_size, long long max_containers, tuple actions, tuple moves, dict stats=None):
    """The plain data the pickle in ``fh`` holds, each device trace whose entries are read as columns
    taken out as a dict of columns: (value, the distinct stacks, the distinct sets of keys outside the
    columns (dicts), the device_traces list, [(index in it, columns)]), the slots of those traces left None for the caller to fill (:mod:`memgate.readers.snapshot_columns`).
    Unsupported where the pure-Python reader must decide. ``stats``, if given, gets the number of entries
    the fast path read ("fast")."""
    reader = _Reader(fh, file_size, max_containers - MARGIN, actions, moves)
    value = reader.run()
    if stats is not None:
        stats["fast"] = reader.fast_taken
    placed = []
    if reader.traces_list is not None:
        lst = reader.traces_list
        for k in range(len(lst)):
            if type(lst[k]) is _Trace:
                placed.append((k, (<_Trace>lst[k]).columns()))
                lst[k] = None
    return value, reader.stacks, reader.extra_sets, reader.traces_list, placed
