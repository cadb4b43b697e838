"""One error family for everything memgate rejects.

Every error carries structured fields (file, line, column, expected, found) so the plugin and the
CLI can render the same one-line message: ``memgate: error: FILE:LINE: ...``.
"""

from __future__ import annotations

from pathlib import Path


class MemgateError(Exception):
    """Base class: bad input, bad configuration, or a metric that cannot be measured."""

    def __init__(
        self,
        message: str,
        *,
        file: str | Path | None = None,
        line: int | None = None,
        column: str | None = None,
        expected: str | None = None,
        found: str | None = None,
    ) -> None:
        self.message = message
        self.file = str(file) if file is not None else None
        self.line = line
        self.column = column
        self.expected = expected
        self.found = found
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
        parts.append(self.message)
        text = " ".join(parts)
        if self.expected is not None:
            text += f"; expected {self.expected}"
        if self.found is not None:
            text += f", found {_clip(self.found)}"
        return text.replace("\n", " ")


class InputError(MemgateError):
    """A profile file is missing, unreadable or malformed."""


class ConfigError(MemgateError):
    """A budget file, marker or command-line option is invalid."""


class NotMeasurable(MemgateError):
    """A budget asks for a metric the profile has no data for."""


def _rebuild(cls: type[MemgateError], message: str, fields: dict[str, object]) -> MemgateError:
    return cls(message, **fields)


def _clip(text: str, limit: int = 80) -> str:
    text = repr(text) if not text.startswith("'") else text
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cannot_read(exc: OSError, path: str | Path, **fields: str) -> InputError:
    """A read that failed although the file looked readable (ACLs, EIO, a file that vanished):
    the file the OS names, else ``path``."""
    return InputError(f"cannot read: {exc.strerror or exc}", file=exc.filename or path, **fields)
