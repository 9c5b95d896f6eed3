"""A disk cache of compiled binaries (and of resource reports), safe to share
between processes.

An entry is one file ``<dir>/<key>.bin``: a header holding the sha256 and length
of the payload, then the payload. It is written to a temp file in the same
folder and renamed into place (atomic), under a per-key ``flock`` on
``<dir>/<key>.lock`` so that processes building the same key at once build it
once and the others wait and read it. An entry whose header does not match its
payload (truncated, corrupted) is deleted and rebuilt. A cache folder that
cannot be written gives one warning and the build goes on uncached.

The folder is ``$MONO_CACHE_DIR``, else ``~/.cache/mono-codegen``; it is read at
every call, so changing the variable takes effect at once."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import struct
import tempfile
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

ENV = "MONO_CACHE_DIR"
_MAGIC = b"MONOJIT1"
# magic, payload sha256, payload length (little-endian u64)
_HEADER = struct.Struct("<8s32sQ")
FORMAT_VERSION = 1  # part of every key: bump to orphan entries of an old layout

_warned_dirs: set[str] = set()


class CorruptEntry(Exception):
    """A cache file whose header does not match its payload."""


def cache_dir() -> Path:
    """The cache folder: ``$MONO_CACHE_DIR`` if set (and not empty), else
    ``~/.cache/mono-codegen``."""
    env = os.environ.get(ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "mono-codegen"


def _canon(value: Any, field: str = "") -> Any:
    """A JSON-able form of ``value``, the same for equal inputs: dicts by key,
    tuples as lists, compile options sorted, bytes as hex."""
    if isinstance(value, dict):
        return {str(k): _canon(v, str(k)) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        items = [_canon(v) for v in value]
        if "option" in field:  # "options", "compile_options": order-free
            items = sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
        return items
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"cache key part {field!r} has unsupported type {type(value).__name__}")


def key(key_parts: dict) -> str:
    """The sha256 (hex) naming the entry for ``key_parts``: typically the source
    text, the compile options (sorted), the compiler's name and version, the
    target arch and the kernel name. Any JSON-able values work."""
    blob = json.dumps(
        {"format": FORMAT_VERSION, "parts": _canon(key_parts)},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def encode_entry(payload: bytes) -> bytes:
    """Header plus ``payload``, as stored."""
    return _HEADER.pack(_MAGIC, hashlib.sha256(payload).digest(), len(payload)) + payload


def decode_entry(data: bytes) -> bytes:
    """The payload of a stored entry; ``CorruptEntry`` if the header, length or
    checksum do not match."""
    if len(data) < _HEADER.size:
        raise CorruptEntry(f"{len(data)} bytes, shorter than the {_HEADER.size}-byte header")
    magic, digest, length = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise CorruptEntry(f"bad magic {magic!r}")
    payload = data[_HEADER.size :]
    if len(payload) != length:
        raise CorruptEntry(f"payload is {len(payload)} bytes, header says {length}")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptEntry("payload sha256 does not match the header")
    return payload


def entry_path(k: str, directory: Path | None = None) -> Path:
    """Where the entry for key ``k`` lives."""
    return (directory or cache_dir()) / f"{k}.bin"


def _warn_unwritable(directory: Path, err: BaseException) -> None:
    d = str(directory)
    if d in _warned_dirs:
        return
    _warned_dirs.add(d)
    log.warning(
        "mono-codegen: the JIT cache folder %s cannot be used (%s); compiling "
        "without a cache. Set %s to a writable folder to cache compiled kernels.",
        d,
        err,
        ENV,
    )


def _read(path: Path) -> bytes | None:
    """The payload at ``path``; None if there is no entry. Raises CorruptEntry."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return decode_entry(data)


def _write_atomic(path: Path, payload: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(encode_entry(payload))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; let other users read
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _remove_corrupt(path: Path, err: CorruptEntry) -> None:
    log.warning("mono-codegen: JIT cache entry %s is corrupt (%s); deleting and rebuilding", path, err)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def get_or_build(key_parts: dict, build: Callable[[], bytes]) -> tuple[bytes, bool]:
    """The cached payload for ``key_parts`` and True, or ``build()``'s result
    (stored for next time) and False.

    Concurrent callers with the same key, in any processes, run ``build`` once:
    the others wait on the key's lock and read the entry it wrote. Exceptions
    from ``build`` (a CompileError, say) go to the caller and store nothing. If
    the cache folder cannot be created or written, one warning is logged and
    ``build()`` is returned uncached."""
    k = key(key_parts)
    directory = cache_dir()
    path = entry_path(k, directory)

    # Fast path: a complete entry needs no lock (entries appear by atomic rename).
    try:
        payload = _read(path)
        if payload is not None:
            return payload, True
    except CorruptEntry:
        pass  # dealt with under the lock below
    except OSError as e:  # unreadable folder or file
        _warn_unwritable(directory, e)
        return bytes(build()), False

    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(directory / f"{k}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        _warn_unwritable(directory, e)
        return bytes(build()), False

    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            payload = _read(path)
            if payload is not None:
                return payload, True
        except CorruptEntry as e:
            _remove_corrupt(path, e)
        except OSError as e:
            _warn_unwritable(directory, e)
            return bytes(build()), False

        payload = bytes(build())
        try:
            _write_atomic(path, payload)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT):
                _warn_unwritable(directory, e)
            else:
                log.warning("mono-codegen: could not store JIT cache entry %s: %s", path, e)
        return payload, False
    finally:
        os.close(lock_fd)  # releases the flock
