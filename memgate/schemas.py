"""The JSON Schemas shipped in ``memgate/schemas/`` (also reachable as ``schemas/`` in the repo)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any


@cache
def load_schema(name: str) -> dict[str, Any]:
    """Return the parsed schema ``<name>.schema.json``."""
    text = resources.files("memgate").joinpath("schemas", f"{name}.schema.json").read_text("utf-8")
    return json.loads(text)  # type: ignore[no-any-return]


def schema_names() -> list[str]:
    folder = resources.files("memgate").joinpath("schemas")
    return sorted(p.name.removesuffix(".schema.json") for p in folder.iterdir() if p.name.endswith(".schema.json"))


def re2_pattern(pattern: str) -> str:
    """Translate an anchored Python/ECMA pattern to RE2 with the same meaning.

    Python's ``$`` also matches before one final newline; RE2's does not.
    """
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        return pattern[:-1] + "\n?$"
    return pattern
