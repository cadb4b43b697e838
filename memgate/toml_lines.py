"""Where a key of a TOML document is written: its 1-based line, for error messages. Pure.

``tomllib`` returns values without positions, so a budget-file error could only name a JSON path
(``budgets/0/peak_alocated``). :func:`key_lines` scans the text once, tracking table headers
(``[a.b]``), arrays of tables (``[[budgets]]``: each ``[[...]]`` opens element 0, 1, …), dotted and
quoted keys, and values that span lines (multi-line strings, arrays), and maps every key path to
the line that declares it. :func:`line_of` looks a path up, falling back to its longest declared
prefix: a key inside an inline table (``op_caps = { "x" = ... }``) is on the line of ``op_caps``.

Only the document's own syntax is read: the scan never fails (text ``tomllib`` accepted is valid
TOML; on anything else a path simply has no line).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

KeyPath = tuple[str | int, ...]

_BARE = r"[A-Za-z0-9_-]+"
_BASIC = r'"(?:[^"\\]|\\.)*"'
_LITERAL = r"'[^']*'"
_SIMPLE = rf"(?:{_BARE}|{_BASIC}|{_LITERAL})"
_DOTTED = rf"{_SIMPLE}(?:\s*\.\s*{_SIMPLE})*"
_KEY_LINE = re.compile(rf"\s*(?P<key>{_DOTTED})\s*=(?P<rest>.*)\Z", re.DOTALL)
_HEADER = re.compile(rf"\s*(?P<open>\[\[?)\s*(?P<key>{_DOTTED})\s*(?P<close>\]\]?)\s*(?:#.*)?\Z", re.DOTALL)
_PART = re.compile(_SIMPLE)
# A basic string's escapes (TOML 1.0, and 1.1's \e and \xHH): what tomllib decodes a key to.
_ESCAPE = re.compile(r"\\(?:u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|x([0-9A-Fa-f]{2})|(.))", re.DOTALL)
_SHORT = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", "e": "\x1b", '"': '"', "\\": "\\"}


def _unescape(match: re.Match[str]) -> str:
    code = match.group(1) or match.group(2) or match.group(3)
    if code is not None:
        return chr(int(code, 16)) if int(code, 16) <= 0x10FFFF else match.group(0)
    return _SHORT.get(match.group(4), match.group(0))


def _key_parts(dotted: str) -> tuple[str, ...]:
    parts = []
    for match in _PART.finditer(dotted):
        text = match.group(0)
        if text.startswith('"'):
            text = _ESCAPE.sub(_unescape, text[1:-1])
        elif text.startswith("'"):
            text = text[1:-1]
        parts.append(text)
    return tuple(parts)


class _Scanner:
    """Tracks what a line starts inside of: a multi-line string, or an open array / inline table."""

    def __init__(self) -> None:
        self.string: str | None = None  # the delimiter of an open multi-line string
        self.depth = 0  # open [ and { of a value

    @property
    def at_statement(self) -> bool:
        return self.string is None and self.depth == 0

    def feed(self, text: str) -> None:
        """Advance over ``text`` (a value, or a whole continuation line)."""
        i, n = 0, len(text)
        while i < n:
            if self.string is not None:
                end = text.find(self.string, i)
                while end != -1 and self.string == '"""' and _escaped(text, end):
                    end = text.find(self.string, end + 1)
                if end == -1:
                    return
                i = end + 3
                self.string = None
                continue
            ch = text[i]
            if ch == "#":
                return
            if text.startswith('"""', i) or text.startswith("'''", i):
                self.string = text[i:i + 3]
                i += 3
            elif ch == '"':
                i += 1
                while i < n and text[i] != '"':
                    i += 2 if text[i] == "\\" else 1
                i += 1
            elif ch == "'":
                end = text.find("'", i + 1)
                i = n if end == -1 else end + 1
            else:
                if ch in "[{":
                    self.depth += 1
                elif ch in "]}":
                    self.depth = max(0, self.depth - 1)
                i += 1


def _escaped(text: str, at: int) -> bool:
    backslashes = 0
    while at - backslashes - 1 >= 0 and text[at - backslashes - 1] == "\\":
        backslashes += 1
    return backslashes % 2 == 1


def key_lines(text: str) -> dict[KeyPath, int]:
    """Every key path the document declares → the 1-based line of its declaration.

    Array-of-tables elements are indexed (``("budgets", 0, "name")``); a header's own path maps to
    the header line (``("budgets", 0)`` → the line of the first ``[[budgets]]``).
    """
    lines: dict[KeyPath, int] = {}
    arrays: dict[KeyPath, int] = {}  # array-of-tables path (indexes of outer arrays resolved) → last index
    table: KeyPath = ()
    scanner = _Scanner()
    for number, line in enumerate(text.splitlines(), start=1):
        if not scanner.at_statement:
            scanner.feed(line)
            continue
        header = _HEADER.match(line)
        if header is not None and (header.group("open") == "[[") == (header.group("close") == "]]"):
            path: list[str | int] = []
            parts = _key_parts(header.group("key"))
            for k, part in enumerate(parts):
                path.append(part)
                here = tuple(path)
                if k == len(parts) - 1 and header.group("open") == "[[":
                    arrays[here] = arrays.get(here, -1) + 1
                    path.append(arrays[here])
                elif here in arrays:
                    path.append(arrays[here])  # a sub-table of the array's last element
            table = tuple(path)
            lines.setdefault(table, number)
            continue
        statement = _KEY_LINE.match(line)
        if statement is None:
            scanner.feed(line)
            continue
        parts = _key_parts(statement.group("key"))
        for k in range(1, len(parts) + 1):
            lines.setdefault(table + parts[:k], number)
        scanner.feed(statement.group("rest"))
    return lines


def line_of(lines: dict[KeyPath, int], path: Sequence[str | int]) -> int | None:
    """The line of ``path``, else of its longest declared prefix; None when no prefix is declared."""
    for end in range(len(path), 0, -1):
        found = lines.get(tuple(path[:end]))
        if found is not None:
            return found
    return None
