"""One error family for everything memgate rejects.

Every error carries structured fields (file, line, column, expected, found) so the plugin and the
CLI can render the same one-line message: ``memgate: error: FILE:LINE: ...``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable, Iterable, Iterator
from pathlib import Path

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: the CLI's --help imports this module
if TYPE_CHECKING:
    from typing import Any, TypeVar

    K = TypeVar("K", bound=Hashable)
    V = TypeVar("V")
    P = TypeVar("P", bound=Path)


class MemgateError(Exception):
    """Base class: bad input, bad configuration, or a metric that cannot be measured.

    ``also``: the further errors of the same input, in file order, when one check finds several (a
    budget file's): this error is the first; :meth:`lines` gives every one-line message."""

    also: tuple[MemgateError, ...] = ()

    def __init__(
        self,
        message: str,
        *,
        file: str | Path | None = None,
        line: int | None = None,
        column: str | None = None,
        expected: str | None = None,
        found: object = None,
    ) -> None:
        self.message = message
        self.file = str(file) if file is not None else None
        self.line = line
        self.column = column
        self.expected = expected
        # A value (not text) is shown with show(): bounded, and never an error of its own.
        self.found: str | None = found if found is None or isinstance(found, str) else show(found)
        super().__init__(self.one_line())

    def __reduce__(self) -> tuple[object, ...]:
        # Errors travel back from --jobs worker processes: keep the structured fields (the default
        # pickles only the one-line text).
        fields = {"file": self.file, "line": self.line, "column": self.column, "expected": self.expected,
                  "found": self.found}
        return _rebuild, (type(self), self.message, fields)

    def location(self) -> str:
        if self.file is None:
            return ""
        return f"{self.file}:{self.line}" if self.line is not None else self.file

    def one_line(self) -> str:
        parts = []
        loc = self.location()
        if loc:
            parts.append(loc + ":")
        if self.column is not None:
            parts.append(f"column {self.column!r}:")
        parts.append(_cut(self.message))
        text = " ".join(parts)
        if self.expected is not None:
            text += f"; expected {_cut(self.expected)}"
        if self.found is not None:
            text += f", found {_clip(self.found)}"
        return printable(text.replace("\n", " "))

    def lines(self) -> list[str]:
        """The one-line message of this error and of each in :attr:`also`, in order."""
        return [self.one_line(), *(e.one_line() for e in self.also)]


class InputError(MemgateError):
    """A profile file is missing, unreadable or malformed."""


class ConfigError(MemgateError):
    """A budget file, marker or command-line option is invalid."""


class NotMeasurable(MemgateError):
    """A budget asks for a metric the profile has no data for."""


class NotSelected(NotMeasurable):
    """A budget selects none of a profile's devices: the check does not apply (a skip, not an error)."""


class SelectsNothing(ConfigError):
    """A budget or marker whose ``ranks`` / ``devices`` select no device of any profile of the run: an error,
    never a run of skips that passes (``--memgate-allow-unselected`` keeps the skips)."""


class AmbiguousProfiles(ConfigError):
    """Profiles of two runs cannot be paired: only pids or timestamps tell some of them apart."""


def _rebuild(cls: type[MemgateError], message: str, fields: dict[str, Any]) -> MemgateError:
    return cls(message, **fields)


# What a terminal acts on rather than shows: C0 controls but tab (ESC starts colour, title and cursor
# sequences; a newline would start a line of a profile's choosing, e.g. a GitHub `::` workflow
# command), DEL, C1 controls, and the bidi overrides that reorder what is shown. The Unicode line and
# paragraph separators too: str.splitlines() (and so pytest, editors and log viewers) ends a line there,
# so every line break str.splitlines() knows is escaped (\x0b, \x0c, \x1c-\x1e and \x85 are controls).
# Lone surrogates too: a file name that is not UTF-8 reaches Python as U+DC80-U+DCFF (one per
# byte; written back as that byte, \xff) and no UTF-8 stream can write one.
BIDI_CONTROLS = frozenset(map(chr, (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))))
_UNPRINTABLE = {c: f"\\x{c:02x}" for c in (*range(0x09), *range(0x0A, 0x20), 0x7F, *range(0x80, 0xA0))} | {
    c: f"\\u{c:04x}" for c in (*map(ord, BIDI_CONTROLS), 0x2028, 0x2029, *range(0xD800, 0xE000))} | {
    c: f"\\x{c - 0xDC00:02x}" for c in range(0xDC80, 0xDD00)}


def printable(text: str) -> str:
    """``text`` (one line) for a terminal or log: those characters written as escapes (``\\x1b``).

    Op names, owners, paths and values come from profile files: a name holding an escape sequence
    must not recolour, retitle or redraw the terminal that shows it, nor start a line of its own,
    and a path that is not UTF-8 must not stop the output (a UTF-8 terminal's stream is strict).
    The result is one line by ``str.splitlines()``; text that names things is escaped where it is made
    (one line per name), never after lines are joined (the join's newlines would be escaped too, or a
    name's newline split into a line of its own)."""
    return text.translate(_UNPRINTABLE)


FOUND_CHARS = 80  # of a found value in the one-line message
_BIG_INT_BITS = 256  # ints wider than this are described, not written out (77 digits)


MESSAGE_CHARS = 2000  # of a message or an expected text: longer is a value that should have been a found


def _cut(text: str, limit: int = MESSAGE_CHARS) -> str:
    """``text`` with its middle left out past ``limit`` characters: a value a message quoted whole
    (a hostile file's 100 KB name) never makes a line of that size; both ends stay readable."""
    if len(text) <= limit:
        return text
    half = (limit - 25) // 2
    return f"{text[:half]} …({len(text) - 2 * half} characters)… {text[-half:]}"


def _clip(text: str, limit: int = FOUND_CHARS) -> str:
    text = show(text, limit) if not text.startswith("'") else text
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Token(str):
    """Text show() writes as it is (brackets, separators), not a value to render."""


def show(value: object, limit: int = FOUND_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, for a message, built in bounded time and memory
    and never raising.

    ``repr()`` itself can fail or run away on what a hostile file decodes to: an int of more than
    4300 digits raises ValueError (``sys.int_max_str_digits``), a list nested a million deep raises
    RecursionError, a pickle can build a list that contains itself, and a 4 GiB string is copied
    whole before any cut. Here containers are walked with an explicit stack of iterators and the
    walk stops once ``limit`` characters are written; a string is cut before it is quoted; an int
    wider than 256 bits is described by its size.
    """
    parts: list[str] = []
    used = 0
    stack: list[Iterator[object]] = [iter((value,))]
    while stack and used <= limit:
        try:
            item = next(stack[-1])
        except StopIteration:
            stack.pop()
            continue
        if type(item) is _Token:
            text: str = item
        elif isinstance(item, (set, frozenset)) and not item:
            text = f"{type(item).__name__}()"
        elif isinstance(item, (list, tuple, set, frozenset)):
            text, closing = ("[", "]") if isinstance(item, list) else ("(", ")") if isinstance(item, tuple) else ("{", "}")
            stack.append(_members(item, ",)" if isinstance(item, tuple) and len(item) == 1 else closing))
        elif isinstance(item, dict):
            text = "{"
            stack.append(_items(item))
        else:
            text = _scalar(item, limit)
        parts.append(text)
        used += len(text)
    out = "".join(parts)
    return out if len(out) <= limit and not stack else out[: max(limit - 3, 0)] + "..."


def _members(items: Iterable[object], closing: str) -> Iterator[object]:
    for i, item in enumerate(items):
        if i:
            yield _Token(", ")
        yield item
    yield _Token(closing)


def _items(mapping: dict[object, object]) -> Iterator[object]:
    for i, (key, item) in enumerate(mapping.items()):
        if i:
            yield _Token(", ")
        yield key
        yield _Token(": ")
        yield item
    yield _Token("}")


def _scalar(value: object, limit: int) -> str:
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        bits = value.bit_length()
        return repr(value) if bits <= _BIG_INT_BITS else f"<{'negative ' if value < 0 else ''}{bits}-bit integer>"
    if isinstance(value, (str, bytes, bytearray)):
        return repr(value[: limit + 1])
    decimal = sys.modules.get("decimal")  # not imported: no value can be a Decimal (and --help need not import it)
    if decimal is not None and isinstance(value, decimal.Decimal):
        digits = len(value.as_tuple().digits)
        return str(value) if digits <= limit else f"<decimal of {digits} digits>"  # a JSON number's text
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a message must never fail: say what it was instead
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit + 1 else text[: limit + 1]


def cannot_read(exc: OSError, path: str | Path, **fields: Any) -> InputError:
    """A read that failed although the file looked readable (ACLs, EIO, a file that vanished):
    the file the OS names, else ``path``."""
    return InputError(f"cannot read: {exc.strerror or exc}", file=exc.filename or path, **fields)


def read_errors_named(load: Callable[[P], V]) -> Callable[[P], V]:
    """A loader whose failed read (os.access said yes, but the read failed: ACLs, EIO, a file that
    vanished) is the one input error :func:`cannot_read` names; the loader keeps its own name."""

    def named(path: P) -> V:
        try:
            return load(path)
        except OSError as exc:
            raise cannot_read(exc, path) from None

    named.__module__, named.__name__, named.__qualname__ = load.__module__, load.__name__, load.__qualname__
    named.__doc__ = load.__doc__
    return named


def remembered(memo: dict[K, V | MemgateError], key: K, make: Callable[[], V]) -> V:
    """``make()``, once per ``key`` in ``memo``: its value, or the MemgateError it raised, raised again
    on every later call (a file that failed to load is not read again, and fails the same way)."""
    if key not in memo:
        try:
            memo[key] = make()
        except MemgateError as exc:
            memo[key] = exc
    found = memo[key]
    if isinstance(found, MemgateError):
        raise found
    return found
