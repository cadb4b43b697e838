"""The optional compiled snapshot reader (memgate/readers/_snapshot_core.pyx); everything else is in pyproject.toml.

Where it cannot be built (no C compiler, no Cython) the install goes on without it and says so once:
memgate then reads snapshots with its pure-Python reader (``memgate --version`` names the reader in use).
``MEMGATE_CFLAGS`` adds compiler flags (the sanitizer build of .ci/run).
"""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

NOTICE = "memgate: the compiled snapshot reader was not built ({}); the pure-Python reader will be used"


class OptionalBuildExt(build_ext):
    """build_ext that never fails the install: a missing compiler or Cython leaves the pure-Python reader."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any build failure falls back
            print(NOTICE.format(str(exc).splitlines()[0] if str(exc) else type(exc).__name__), file=sys.stderr)

    def build_extension(self, ext: object) -> None:
        try:
            super().build_extension(ext)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001
            print(NOTICE.format(str(exc).splitlines()[0] if str(exc) else type(exc).__name__), file=sys.stderr)


def extensions() -> list[object]:
    if os.environ.get("MEMGATE_PURE_PYTHON", "").strip() not in ("", "0"):
        print(NOTICE.format("MEMGATE_PURE_PYTHON is set"), file=sys.stderr)
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        print(NOTICE.format("Cython is not installed"), file=sys.stderr)
        return []
    from setuptools import Extension

    flags = os.environ.get("MEMGATE_CFLAGS", "").split()
    ext = Extension("memgate.readers._snapshot_core", ["memgate/readers/_snapshot_core.pyx"],
                    extra_compile_args=flags, extra_link_args=flags)
    return list(cythonize([ext], language_level=3, quiet=True))


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
