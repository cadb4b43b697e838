"""Number cells proven to match their schema pattern without a regular expression per cell.

Two shapes cover what profilers print, each checked over a whole block in a few vectorized passes;
a block of any other shape gets no proof and is checked cell by cell against the pattern, so no
result depends on which path ran (``tests/test_numtext.py`` compares them on random text).

- **Fixed layout.** Times have a fixed number of decimals (torch_npu: ``1764246877082702.440<TAB>``),
  so in a block every cell has the same width and its dot in the same place. Viewed as a
  (rows × width) byte matrix, one pass checks every cell is ``digits[.digits][TAB]`` and another
  builds its integer value: a tenth of what a regular expression plus a decimal cast cost per cell.
- **Float text.** Sizes in MB vary in width (``4301.658203125``, ``110.0``). Arrow's float parser
  accepts ``[+-]? (digits [. digits?] | . digits) ([eE] [+-]? digits)?`` and inf / infinity / nan;
  a cell it accepts whose first character is a digit or ``-`` followed by a digit, whose last
  character is a digit and whose every dot is followed by a digit is ``-?digits(.digits)?(e[+-]?digits)?``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_DOT = (ord(".") - ord("0")) % 256  # a dot after the uint8 subtraction of '0'
_TAB = ord("\t")
_INT64_MAX = 2**63 - 1
MAX_WIDTH = 40  # wider cells are not numbers profilers print; the general path names them
_ZERO = np.uint8(ord("0"))
_MINUS = ord("-")

# Schema patterns (as the row schemas spell them) and whether they accept a fixed layout with a
# fraction / a trailing TAB. Every layout is digits[.digits][TAB] with digits on both sides of the dot.
_PATTERNS: dict[str, tuple[bool, bool]] = {  # pattern: (fraction allowed, TAB allowed)
    r"^[0-9]+(\.[0-9]+)?\t?$": (True, True),
    r"^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$": (True, False),
    r"^-?[0-9]+(\.[0-9]+)?$": (True, False),
    r"^[0-9]+(\.[0-9]+)?$": (True, False),
    r"^[0-9]+$": (False, False),
    r"^-?[0-9]+$": (False, False),
}


_FLOAT_TEXT = r"^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$"
_TIME_TEXT = r"^[0-9]+(\.[0-9]+)?\t?$"
_OR_NA = "|^N/A$"  # MindSpore's columns also allow N/A
_MAX_CELL = 255  # the per-cell dot count of the time check is a uint8 sum


@dataclass(frozen=True)
class Parsed:
    """What proving a column valid computed on the way, for its conversion to reuse (each cell is
    then read once: :class:`memgate.readers.convert.FromParsed`)."""

    fixed: FixedColumn | None = None  # the digit matrix of a fixed layout
    floats: pa.Array | None = None  # float text cast to float64, null where the cell is
    encoded: pa.DictionaryArray | None = None  # a column of few distinct values, dictionary-encoded


def proven_valid(col: pa.Array, pattern: str) -> bool:
    """True when every non-null cell of ``col`` matches the schema ``pattern``; False: not proven
    (check the cells against the pattern)."""
    return prove(col, pattern) is not None


def prove(col: pa.Array, pattern: str) -> Parsed | None:
    """:func:`proven_valid`, with what the proof computed (None: not proven)."""
    number = pattern.removesuffix(_OR_NA)
    if number not in _PATTERNS or not isinstance(col, pa.Array) or col.type != pa.string() \
            or col.null_count == len(col):
        return None
    fixed = fixed_column(col)
    if fixed is not None:
        return Parsed(fixed=fixed) if fixed.accepted_by(number) else None
    if number == _FLOAT_TEXT:
        floats = _float_text(col)
        return Parsed(floats=floats) if floats is not None else None
    if number == _TIME_TEXT and _time_text(col):
        return Parsed()
    return None


def _cells(col: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(text, starts, ends) of the non-null cells; None when a non-null cell is empty."""
    offsets, text = offsets_and_text(col)
    starts, ends = offsets[:-1] - offsets[0], offsets[1:] - offsets[0]
    if col.null_count:  # null cells are empty
        filled = ends > starts
        valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        if (valid & ~filled).any():
            return None
        starts, ends = starts[filled], ends[filled]
    elif (ends <= starts).any():
        return None
    return text, starts, ends


def _time_text(col: pa.Array) -> bool:
    """Every non-null cell is ``digits[.digits][TAB]`` (cells of any width), in a few passes over the
    column's bytes: only digits, dots and TABs; a TAB only last; a digit first and last before the
    TAB; each dot followed by a digit; at most one dot per cell."""
    cells = _cells(col)
    if cells is None:
        return False
    text, starts, ends = cells
    if not len(starts) or int((ends - starts).max()) > _MAX_CELL:
        return False
    digit = (text - _ZERO) <= 9
    dot = text == ord(".")
    tab = text == _TAB
    if not (digit | dot | tab).all():
        return False
    tab_last = tab[ends - 1]
    if int(np.count_nonzero(tab)) != int(np.count_nonzero(tab_last)):  # a TAB that is not a cell's last
        return False
    body_end = ends - 1 - tab_last
    if (body_end < starts).any() or not digit[starts].all() or not digit[body_end].all():
        return False
    if not dot.any():
        return True
    if (dot[:-1] & ~digit[1:]).any():  # a dot is never a cell's last byte (that is a digit or a TAB)
        return False
    return not (np.add.reduceat(dot.view(np.uint8), starts) > 1).any()


def _float_text(col: pa.Array) -> pa.Array | None:
    """The column as float64 when every non-null cell is float text (the module docstring), else None."""
    try:
        floats = pc.cast(col, pa.float64())  # the grammar in the module docstring, checked in C
    except pa.ArrowInvalid:
        return None
    return floats if _float_text_bytes(col) else None


def _float_text_bytes(col: pa.Array) -> bool:
    offsets, text = offsets_and_text(col)
    starts, ends = offsets[:-1] - offsets[0], offsets[1:] - offsets[0]
    if col.null_count:  # null cells are empty; a non-null cell is not (the cast rejects "")
        filled = ends > starts
        starts, ends = starts[filled], ends[filled]
    first = text[starts]
    minus = first == _MINUS
    if ((first - _ZERO > 9) & ~minus).any():
        return False
    if minus.any() and (text[starts[minus] + 1] - _ZERO > 9).any():
        return False
    if (text[ends - 1] - _ZERO > 9).any():
        return False
    # each dot is followed by a digit (a cell's last character is one, so the byte after a dot is in
    # its cell): compared shifted by one over all bytes, cheaper than gathering the dots' neighbours
    return not ((text[:-1] == ord(".")) & ((text[1:] - _ZERO) > 9)).any()


def offsets_and_text(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A string array's cell offsets and the bytes they index, read in place (read-only)."""
    offset_buf, data_buf = col.buffers()[1:3]
    offsets = np.frombuffer(offset_buf, dtype=np.int32, count=len(col) + 1, offset=col.offset * 4)
    text = np.frombuffer(data_buf, dtype=np.uint8, count=int(offsets[-1] - offsets[0]), offset=int(offsets[0]))
    text.setflags(write=False)  # the column's own bytes
    return offsets, text


@dataclass(frozen=True)
class FixedColumn:
    """A text column whose every non-null cell is ``int_digits`` digits, an optional dot and
    ``frac_digits`` digits, and an optional TAB."""

    digits: np.ndarray  # (width, non-null rows) uint8 digit values, one row per character position
    int_digits: int
    frac_digits: int
    tab: bool
    valid: np.ndarray | None  # which rows are not null; None when none is

    def accepted_by(self, pattern: str) -> bool:
        """Whether the schema ``pattern`` accepts every non-null cell (False: ask the pattern)."""
        allowed = _PATTERNS.get(pattern.removesuffix(_OR_NA))  # a union accepts what its first part does
        if allowed is None:
            return False
        fraction, tab = allowed
        return (fraction or not self.frac_digits) and (tab or not self.tab)

    def scaled_ints(self, decimals: int) -> pa.Array | None:
        """The values × 10**decimals as int64 (fraction digits past ``decimals`` dropped), or None when
        one could pass int64 (the general path then names the cell)."""
        used = min(self.frac_digits, decimals)
        rows = list(range(self.int_digits)) + [self.int_digits + 1 + i for i in range(used)]
        if len(rows) + decimals - used > 19:
            return None
        acc = np.zeros(self.digits.shape[1], dtype=np.uint64)
        for row in rows:  # Horner over character positions, each a contiguous run of rows
            acc *= np.uint64(10)
            acc += self.digits[row]
        if decimals > used:
            acc *= np.uint64(10 ** (decimals - used))
        if len(rows) + decimals - used == 19 and bool((acc > _INT64_MAX).any()):
            return None
        values = acc.view(np.int64)
        if self.valid is None:
            return pa.array(values, type=pa.int64())
        full = np.zeros(len(self.valid), dtype=np.int64)
        full[self.valid] = values
        return pa.array(full, type=pa.int64(), mask=~self.valid)


def fixed_column(col: pa.Array) -> FixedColumn | None:
    """The column as a :class:`FixedColumn`, or None when its cells do not share one such layout."""
    if len(col) == 0 or col.type != pa.string() or col.null_count == len(col):
        return None
    offsets, text = offsets_and_text(col)
    lengths = np.diff(offsets)
    valid = None
    if col.null_count:
        valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        width = int(lengths[np.argmax(valid)])
        uniform = bool((lengths == np.where(valid, width, 0)).all())
    else:
        width = int(lengths[0])
        uniform = bool((lengths == width).all())
    if not uniform or not 0 < width <= MAX_WIDTH:
        return None
    matrix = text.reshape(-1, width)
    tab = bool(matrix[0, -1] == _TAB)
    if tab and not bool((matrix[:, -1] == _TAB).all()):
        return None
    # Character positions as rows: each check and each Horner step then reads contiguous memory.
    body = width - tab
    digits = np.empty((body, len(matrix)), dtype=np.uint8)
    np.subtract(matrix[:, :body].T, _ZERO, out=digits)
    dots = np.flatnonzero(digits[:, 0] == _DOT)
    if len(dots) > 1:
        return None
    dot = int(dots[0]) if len(dots) else -1
    if dot in (0, body - 1):  # ".5", "5." are not digits on both sides
        return None
    if dot >= 0:
        if not bool((digits[dot] == _DOT).all()) or not (digits[:dot] <= 9).all() or not (digits[dot + 1:] <= 9).all():
            return None
        return FixedColumn(digits, dot, body - dot - 1, tab, valid)
    if not (digits <= 9).all():
        return None
    return FixedColumn(digits, body, 0, tab, valid)
