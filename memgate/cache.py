"""A cache of loaded profiles, keyed on the content of the files they were loaded from.

Loading a gigabyte trace or a 10-million-row CSV takes tens of seconds; reading back the normalized
tables takes well under one. An entry is ``<cache_dir>/<key>/``: one Arrow IPC (feather) file per
table (:meth:`memgate.table.Table.to_arrow`: int64 with nulls, dictionary text) and a
``manifest.json`` with everything else (paths, rank, metadata, each column's kind, and the size and
hash of every feather file). Reading an entry back imports pyarrow and numpy, not pandas. The key is
a hash of:

- every input file of the profile (a directory profile: every regular file under it, with its
  relative path and size; a file profile: the file), so any changed byte is a different key;
- memgate's version, the hash of memgate's own source (a loader fixed without a version bump must
  not be served its old output), the cache layout version and pyarrow's version (which writes the
  feather files);
- the loader's format name and the profile's path (the rank and the ``source`` strings are derived
  from the path, so the same bytes elsewhere are a different profile), and, for the formats whose
  owners are Python frames, the working directory (an owner names its file relative to it,
  :mod:`memgate.owners`).

Entries are written into a temporary directory inside ``cache_dir`` and renamed into place in one
step, so a reader sees a whole entry or none; of two writers of the same key the second rename
fails and that writer discards its copy. An entry that does not verify (manifest unreadable, a file
missing, a size or hash that differs) is removed and treated as a miss, never trusted. Errors are
never cached: a profile that fails to load raises every time. Nothing is ever written into the
profile directory.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memgate import __version__
from memgate.discover import Found, load
from memgate.errors import ConfigError, InputError
from memgate.lazy import arrow_without_pandas, lazy_module
from memgate.metric_cache import MetricCache
from memgate.metrics import DeviceMetrics, MetricOptions
from memgate.model import (
    MAX_BYTES,
    DeviceModel,
    OutOfMemory,
    PoolState,
    Profile,
    ProfileInfo,
    Series,
    check_byte_ranges,
)
from memgate.owners import FRAME_OWNER_FORMATS
from memgate.table import Ints, Table, Texts

if TYPE_CHECKING:
    import pyarrow as pa
else:  # imported on first use: pytest loads the plugin, and so this module, on every run
    pa = lazy_module("pyarrow", globals(), "pa")

try:  # xxh3 hashes at memory speed; blake2b is the standard-library fallback (~1 GB/s)
    import xxhash

    HASH_NAME = "xxh3_128"
    _new_hash: Callable[[], Any] = xxhash.xxh3_128
except ModuleNotFoundError:  # pragma: no cover - xxhash is a dependency
    HASH_NAME = "blake2b-128"
    _new_hash = functools.partial(hashlib.blake2b, digest_size=16)

CACHE_LAYOUT = 6  # bump when the entry layout changes (4: Tables as Arrow; 5: device steps, requested peak; 6: ooms)
MANIFEST = "manifest.json"
_CHUNK = 8 << 20
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
_STALE_TMP_S = 3600.0  # a temp dir this old belongs to a writer that died
# The model fields this module stores; a model with other fields is not cached (it would lose them).
_PROFILE_FIELDS = ("path", "format", "rank", "devices", "steps", "steps_source", "metadata")
_DEVICE_FIELDS = ("device", "series", "blocks", "blocks_source", "sum_components", "dump_state", "window_relative",
                  "requested_peak", "steps", "ooms")
_SERIES_FIELDS = ("component", "frame", "source")


# ---- keys -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputFile:
    rel: str  # path relative to the profile ('' for a file profile), '/'-separated
    path: Path
    size: int
    mtime_ns: int
    inode: int


def input_files(profile_path: Path) -> list[InputFile]:
    """The files a loader may read: the file itself (and a sqlite db's ``-wal`` / ``-journal``, whose
    pending changes the db reader applies), or every regular file under the directory.

    Symlinks are followed (as discovery follows them), loops are cut, the order is stable.
    """
    st = os.stat(profile_path)
    if not stat.S_ISDIR(st.st_mode):
        single = [InputFile("", profile_path, st.st_size, st.st_mtime_ns, st.st_ino)]
        for suffix in ("-wal", "-journal"):
            log = Path(str(profile_path) + suffix)
            if log.is_file():
                lst = log.stat()
                single.append(InputFile(suffix, log, lst.st_size, lst.st_mtime_ns, lst.st_ino))
        return single
    found: list[InputFile] = []
    seen: set[tuple[int, int]] = set()
    for current, dirs, files in os.walk(profile_path, followlinks=True):
        here = Path(current)
        dst = os.stat(here)
        if (dst.st_dev, dst.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((dst.st_dev, dst.st_ino))
        dirs.sort()
        for name in sorted(files):
            path = here / name
            try:
                fst = os.stat(path)
            except FileNotFoundError:  # a dangling symlink: no loader can read it either
                continue
            if stat.S_ISREG(fst.st_mode):
                rel = path.relative_to(profile_path).as_posix()
                found.append(InputFile(rel, path, fst.st_size, fst.st_mtime_ns, fst.st_ino))
    found.sort(key=lambda f: f.rel)
    return found


def _signature(files: list[InputFile]) -> tuple[tuple[str, int, int, int], ...]:
    return tuple((f.rel, f.size, f.mtime_ns, f.inode) for f in files)


def hash_file(path: Path, into: Any | None = None) -> Any:
    """Feed the bytes of ``path`` to ``into`` (a new hash when None) in large chunks; return the hash."""
    h = _new_hash() if into is None else into
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            h.update(view[:n])
    return h


# Modules that only read a loaded profile (metrics, budgets, reports, the shells): editing them does
# not change what a loader returns, so they stay out of the fingerprint. Every other module (loaders,
# their helpers, schemas, and any module added later) is in it.
_DOWNSTREAM = frozenset({
    "__init__.py", "__main__.py", "cache.py", "cli.py", "plugin.py", "session.py", "budgets.py", "metrics.py",
    "reconcile.py", "report.py", "html_report.py", "compare.py", "ci.py", "record.py", "lttb.py", "sizes.py",
    "autosave.py", "identity.py", "toml_lines.py", "schemas/budgets.schema.json", "schemas/report.schema.json",
    "schemas/baseline.schema.json",
})


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """memgate's version and a hash of the source files that make a loaded profile (a loader fixed
    without a version bump must not be served its old output)."""
    h = _new_hash()
    h.update(f"{__version__}\0{CACHE_LAYOUT}\0{HASH_NAME}\0{pa.__version__}\0".encode())
    package = Path(__file__).resolve().parent
    for path in sorted(package.rglob("*")):
        if path.suffix in (".py", ".json") and path.is_file() and path.relative_to(package).as_posix() not in _DOWNSTREAM:
            h.update(path.relative_to(package).as_posix().encode() + b"\0")
            h.update(path.read_bytes())
    return str(h.hexdigest())


# What computes metrics from a loaded profile: a stored result made by other code is computed again.
_METRICS_CODE = ("metrics.py", "reconcile.py", "sizes.py")


@functools.lru_cache(maxsize=1)
def metrics_fingerprint() -> str:
    h = _new_hash()
    package = Path(__file__).resolve().parent
    for name in _METRICS_CODE:
        h.update(name.encode() + b"\0" + (package / name).read_bytes())
    return str(h.hexdigest())


def _key_of(found: Found, files: list[InputFile]) -> str:
    h = _new_hash()
    h.update(b"memgate-profile-cache\0" + code_fingerprint().encode() + b"\0")
    h.update(found.format.name.encode() + b"\0" + os.fsencode(os.path.abspath(found.path)) + b"\0")
    if found.format.name in FRAME_OWNER_FORMATS:  # their owners name files relative to it (memgate.owners)
        h.update(os.fsencode(os.getcwd()) + b"\0")
    for f in files:
        h.update(f.rel.encode() + b"\0" + f.size.to_bytes(8, "little"))
        hash_file(f.path, h)
    return str(h.hexdigest())


def profile_key(found: Found) -> str:
    """The cache key of ``found`` as its files are now."""
    return _key_of(found, input_files(found.path))


# ---- tables <-> Arrow -----------------------------------------------------------------------------


def _kind_of(table: Table, name: str) -> str:
    """The manifest's name for the kind of a column: ``int64`` or ``text``."""
    column = table.column(name)
    if isinstance(column, Ints):
        return "int64"
    if isinstance(column, Texts):
        return "text"
    raise _Uncacheable(f"column {name!r} is a {type(column).__name__}")


class _Uncacheable(Exception):
    """The profile holds something this cache cannot store exactly."""


def _write_table(table: Table, path: Path, compression: str | None = None) -> dict[str, Any]:
    kinds = {name: _kind_of(table, name) for name in table.columns}
    with arrow_without_pandas():
        arrow = table.to_arrow()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, arrow.schema, options=options) as writer:
        writer.write_table(arrow)
    return {"file": path.name, "columns": list(table.columns), "kinds": kinds, "rows": len(table),
            "size": path.stat().st_size, "hash": str(hash_file(path).hexdigest())}


def _read_table(entry: Path, spec: dict[str, Any]) -> Table:
    path = entry / spec["file"]
    data = path.read_bytes()
    if len(data) != spec["size"]:
        raise _Corrupt(f"{spec['file']}: {len(data)} bytes, manifest says {spec['size']}")
    h = _new_hash()
    h.update(data)
    if h.hexdigest() != spec["hash"]:
        raise _Corrupt(f"{spec['file']}: hash differs from the manifest")
    with arrow_without_pandas():  # pyarrow would import pandas (~0.4 s) to convert a scalar or a bool array
        table = Table.from_arrow(pa.ipc.open_file(pa.py_buffer(data)).read_all())
    if list(table.columns) != spec["columns"] or len(table) != spec["rows"] \
            or {name: _kind_of(table, name) for name in table.columns} != spec["kinds"]:
        raise _Corrupt(f"{spec['file']}: columns, kinds or rows differ from the manifest")
    return table


class _Corrupt(Exception):
    """An entry that does not verify."""


def _refuse_constant(text: str) -> Any:
    raise _Corrupt(f"{text} in a cache file (memgate never writes it)")


def _finite(text: str) -> float:
    value = float(text)
    if value - value != 0:
        raise _Corrupt(f"number {text[:20]} past the float range in a cache file")
    return value


def _strict_json(raw: bytes) -> Any:
    """A cache file's JSON: NaN, Infinity and out-of-range floats raise _Corrupt (the entry is a miss)."""
    try:
        return json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite)
    except RecursionError:
        raise _Corrupt("nested too deep") from None


def _check_info(info: Any) -> None:
    """A manifest's ProfileInfo as memgate writes it: text, a JSON object, steps of int64 or null."""
    if not isinstance(info, dict) or not all(isinstance(info.get(k), str) for k in ("path", "format", "rank")) \
            or not isinstance(info.get("metadata"), dict) or not isinstance(info.get("steps"), list):
        raise _Corrupt("info is not a ProfileInfo")
    for step in info["steps"]:
        if not isinstance(step, dict) or not all(
                v is None or (type(v) is int and -(2**63) <= v < 2**63) for v in step.values()):
            raise _Corrupt("a step is not int64 numbers")


def _check_devices(devices: Any) -> None:
    """Stored metric results as a JSON report holds them (schemas/report.schema.json: types, byte
    counts within 2**56, ratios within [0, 1]); else _Corrupt."""
    from memgate.documents import schema_error

    if not isinstance(devices, list):
        raise _Corrupt("devices is not a list")
    report = {"memgate_version": __version__, "budgets": [],
              "profiles": [{"path": "", "format": "", "rank": "", "devices": devices}]}
    error = schema_error(report, "report", file="cache", what="cached result")
    if error is not None:
        raise _Corrupt(error.one_line())


def _exact_json(value: Any) -> str:
    """JSON text that loads back equal to ``value`` (no tuple→list, no NaN, no str keys from ints)."""
    try:
        text = json.dumps(value, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise _Uncacheable(f"metadata is not plain JSON: {exc}") from None
    if json.loads(text) != value or not _same_types(json.loads(text), value):
        raise _Uncacheable("metadata does not survive a JSON round trip")
    return text


def _same_types(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return all(_same_types(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return all(_same_types(x, y) for x, y in zip(a, b))
    return True


def _check_model_fields() -> None:
    for cls, known in ((Profile, _PROFILE_FIELDS), (DeviceModel, _DEVICE_FIELDS), (Series, _SERIES_FIELDS)):
        names = tuple(f.name for f in fields(cls))
        if sorted(names) != sorted(known):
            raise _Uncacheable(f"{cls.__name__} has fields {names}; this cache stores {known}")


def _serialize(profile: Profile, into: Path, compression: str | None = None) -> dict[str, Any]:
    _check_model_fields()
    counter = iter(range(1 << 30))

    def stored(table: Table, what: str) -> dict[str, Any]:
        if not isinstance(table, Table):
            raise _Uncacheable(f"{what} is not a Table")
        return _write_table(table, into / f"{next(counter):04d}-{what}.arrow", compression)

    devices = []
    for d, device in enumerate(profile.devices):
        series = []
        for s, (key, item) in enumerate(device.series.items()):
            series.append({"key": key, "component": item.component, "source": item.source,
                           "frame": stored(item.frame, f"d{d}-s{s}")})
        devices.append({
            "device": device.device,
            "series": series,
            "blocks": stored(device.blocks, f"d{d}-blocks"),
            "blocks_source": device.blocks_source,
            "sum_components": {k: list(v) for k, v in device.sum_components.items()},
            "dump_state": None if device.dump_state is None else asdict(device.dump_state),
            "window_relative": device.window_relative,
            "requested_peak": device.requested_peak,
            "steps": None if device.steps is None else stored(device.steps, f"d{d}-steps"),
            "ooms": None if device.ooms is None else [asdict(oom) for oom in device.ooms],
        })
    head = {"path": profile.path, "format": profile.format, "rank": profile.rank,
            "steps_source": profile.steps_source}
    for name, value in head.items():
        if value is not None and not isinstance(value, str):
            raise _Uncacheable(f"Profile.{name} is not a string")
    return {
        **head,
        "metadata": _exact_json(profile.metadata),
        "steps": stored(profile.steps, "steps"),
        "devices": devices,
    }


def _deserialize(entry: Path, doc: dict[str, Any]) -> Profile:
    devices = []
    for d in doc["devices"]:
        series = {s["key"]: Series(s["component"], _read_table(entry, s["frame"]), s["source"]) for s in d["series"]}
        devices.append(DeviceModel(
            device=d["device"],
            series=series,
            blocks=_read_table(entry, d["blocks"]),
            blocks_source=d["blocks_source"],
            sum_components={k: tuple(v) for k, v in d["sum_components"].items()},
            dump_state=None if d["dump_state"] is None else PoolState(**d["dump_state"]),
            window_relative=bool(d["window_relative"]),
            requested_peak=d.get("requested_peak"),
            steps=None if d.get("steps") is None else _read_table(entry, d["steps"]),
            ooms=None if d.get("ooms") is None else tuple(OutOfMemory(**oom) for oom in d["ooms"]),
        ))
    for name in ("path", "format", "rank"):
        if not isinstance(doc[name], str):
            raise _Corrupt(f"{name} is not text")
    profile = Profile(
        path=doc["path"],
        format=doc["format"],
        rank=doc["rank"],
        devices=tuple(devices),
        steps=_read_table(entry, doc["steps"]),
        steps_source=doc["steps_source"],
        metadata=_strict_json(doc["metadata"].encode("utf-8")),
    )
    for device in profile.devices:  # what a fresh load checks, a read back checks too
        peak = device.requested_peak
        if peak is not None and (type(peak) is not int or not 0 <= peak <= MAX_BYTES):
            raise _Corrupt("requested_peak is not a byte count")
    try:
        check_byte_ranges(profile)
    except InputError as exc:
        raise _Corrupt(exc.one_line()) from None
    return profile


# ---- the cache ------------------------------------------------------------------------------------


class ProfileCache:
    """Loaded profiles under ``cache_dir``, one directory per key (see the module docstring)."""

    def __init__(self, cache_dir: str | os.PathLike[str], *, compression: str | None = "zstd") -> None:
        # zstd: a third of lz4's size and a fifth of the raw Arrow size for about the same read time
        # (10M-row torch_npu profile: raw 707 MiB / 2.0 s, lz4 314 MiB / 1.1 s, zstd 158 MiB / 1.4 s)
        self.cache_dir = Path(cache_dir)
        self.compression = compression

    def key(self, found: Found) -> str:
        """The key of ``found`` as its files are now (hashes every input file: no stat shortcut)."""
        return _key_of(found, input_files(found.path))

    def _check_outside(self, found: Found) -> None:
        profile = Path(os.path.realpath(found.path))
        cache = Path(os.path.realpath(self.cache_dir))
        if cache == profile or profile in cache.parents:
            raise ConfigError("the cache directory is inside the profile directory", file=self.cache_dir,
                              expected=f"a cache directory outside {found.path} (memgate never writes there)")

    def entry_dir(self, key: str) -> Path:
        return self.cache_dir / key

    def get(self, found: Found) -> Profile | None:
        """The cached profile of ``found`` as its files are now, or None (a miss or an entry that fails checks)."""
        self._check_outside(found)
        try:
            key = self.key(found)
        except OSError:
            return None  # loading will name the unreadable file
        return self._get(key, found)

    def _get(self, key: str, found: Found) -> Profile | None:
        doc = self._manifest(key, found)
        if doc is None:
            return None
        entry = self.entry_dir(key)
        try:
            return _deserialize(entry, doc["profile"])
        except (_Corrupt, ValueError, KeyError, TypeError, IndexError, AttributeError, OSError, RecursionError,
                pa.ArrowException):
            self._discard(entry)
            return None

    def _manifest(self, key: str, found: Found) -> dict[str, Any] | None:
        """The manifest of ``key``'s entry if it is one for ``found`` (a bad one is discarded)."""
        entry = self.entry_dir(key)
        try:
            raw = (entry / MANIFEST).read_bytes()
        except FileNotFoundError:
            if entry.exists():
                self._discard(entry)  # a directory without a manifest is not an entry
            return None
        except OSError:
            return None
        try:
            doc = _strict_json(raw)
            if not isinstance(doc, dict) or doc.get("layout") != CACHE_LAYOUT or doc.get("key") != key \
                    or doc.get("format") != found.format.name or not isinstance(doc.get("profile"), dict):
                raise _Corrupt("manifest does not match")
            _check_info(doc.get("info"))
            return doc
        except (_Corrupt, ValueError):
            self._discard(entry)
            return None

    def put(self, found: Found, profile: Profile) -> None:
        """Store ``profile`` as the load of ``found``'s current files (a no-op if the cache cannot hold it)."""
        self._check_outside(found)
        self._put(self.key(found), found, profile)

    def _put(self, key: str, found: Found, profile: Profile) -> None:
        final = self.entry_dir(key)
        if final.exists():
            return
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{key}-", dir=self.cache_dir))
        except OSError:
            return  # a read-only or full cache never stops a load
        try:
            body = _serialize(profile, tmp, self.compression)
            manifest = {"layout": CACHE_LAYOUT, "key": key, "format": found.format.name,
                        "memgate_version": __version__, "hash": HASH_NAME, "created": time.time(),
                        "profile": body, "info": ProfileInfo.of(profile).as_json()}
            (tmp / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
            os.rename(tmp, final)  # atomic; fails when another writer got there first
        except (_Uncacheable, OSError, pa.ArrowException):
            pass  # the loser of a race, a full disk, or a profile the cache cannot hold exactly
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        self._sweep()

    def _discard(self, entry: Path) -> None:
        """Remove a bad entry: renamed away first, so no reader sees it half deleted."""
        trash = self.cache_dir / f"{_TRASH_PREFIX}{entry.name}-{os.getpid()}-{time.monotonic_ns()}"
        try:
            os.rename(entry, trash)
        except OSError:
            return  # already gone (another reader removed it)
        shutil.rmtree(trash, ignore_errors=True)

    def _sweep(self) -> None:
        """Remove temp dirs of writers that died (older than an hour) and leftover trash."""
        now = time.time()
        try:
            names = os.listdir(self.cache_dir)
        except OSError:
            return
        for name in names:
            if name.startswith((_TMP_PREFIX, _TRASH_PREFIX)):
                path = self.cache_dir / name
                try:
                    old = now - path.stat().st_mtime > _STALE_TMP_S
                except OSError:
                    continue
                if old:
                    shutil.rmtree(path, ignore_errors=True)


def open_profile(found: Found, cache: ProfileCache | None) -> MetricCache:
    """``found`` ready to be judged and reported.

    With a ``cache`` entry for ``found``'s current files, the metrics an earlier run computed are
    read back and the profile's tables are loaded only if a result is missing; otherwise the
    profile is loaded and stored (unless a file changed while it loaded), and so are its results.
    """
    if cache is None:
        return MetricCache(load(found))
    cache._check_outside(found)
    try:
        before = input_files(found.path)
        key = _key_of(found, before)
    except OSError:
        return MetricCache(load(found))  # the loader names the unreadable file
    store = ResultStore(cache.entry_dir(key), key)
    doc = cache._manifest(key, found)
    if doc is not None:
        try:
            info = ProfileInfo.from_json(doc["info"])
        except (KeyError, TypeError, ValueError):
            cache._discard(cache.entry_dir(key))
        else:
            return MetricCache(info=info, load=lambda: cache._get(key, found) or load(found), store=store)
    profile = load(found)  # an error propagates and is not cached
    try:
        unchanged = _signature(input_files(found.path)) == _signature(before)
    except OSError:
        unchanged = False
    if unchanged:  # a file rewritten while it loaded: the profile matches neither version's key
        cache._put(key, found, profile)
    return MetricCache(profile, store=store if cache.entry_dir(key).exists() else None)


def load_cached(found: Found, cache: ProfileCache | None) -> Profile:
    """``found`` loaded, from ``cache`` when it holds it; a fresh load is stored unless a file changed meanwhile."""
    return open_profile(found, cache).profile


class ResultStore:
    """Metric results of one cache entry, one JSON file per :class:`MetricOptions`.

    Written after the entry (a first run computes them while it judges), each atomically (a temp
    file renamed into place); removed with their entry. A file that does not read back is deleted
    and computed again.
    """

    def __init__(self, entry: Path, key: str) -> None:
        self.entry = entry
        self.key = key

    def _path(self, options: MetricOptions) -> Path:
        token = hashlib.blake2b(json.dumps(options.as_json(), sort_keys=True).encode(), digest_size=8).hexdigest()
        return self.entry / f"metrics-{token}.json"

    def get(self, options: MetricOptions) -> list[DeviceMetrics] | None:
        path = self._path(options)
        try:
            doc = _strict_json(path.read_bytes())
            if doc["key"] != self.key or doc["metrics_code"] != metrics_fingerprint() \
                    or doc["options"] != options.as_json():
                raise _Corrupt("result of another request")
            _check_devices(doc["devices"])  # a tampered result is computed again, never reported
            return [DeviceMetrics.from_json(d) for d in doc["devices"]]
        except FileNotFoundError:
            return None
        except (_Corrupt, ValueError, KeyError, TypeError, AttributeError, IndexError, OSError, RecursionError):
            path.unlink(missing_ok=True)
            return None

    def put(self, options: MetricOptions, metrics: list[DeviceMetrics]) -> None:
        devices = [m.as_json() for m in metrics]
        if [DeviceMetrics.from_json(json.loads(json.dumps(d))).as_json() for d in devices] != devices:
            return  # a value JSON would not give back exactly: compute it each time instead
        doc = {"key": self.key, "metrics_code": metrics_fingerprint(), "options": options.as_json(),
               "devices": devices}
        try:
            fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=self.entry)
        except OSError:
            return  # the entry is gone, or the cache is read-only: never stops a run
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(doc, fh)
            os.replace(tmp, self._path(options))
        except OSError:
            Path(tmp).unlink(missing_ok=True)
