"""Atomic file writes: a reader never sees a half-written file, a killed process never leaves one.

Files get the permissions any ``open(path, "w")`` would give (0666 minus the umask): ``mkstemp`` creates its
temporary file 0600, which would otherwise survive the rename and hide reports and the README from other users.
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


def _umask() -> int:
    try:  # Linux reports it without changing it (setting it, even briefly, races with other threads)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path in the same directory; rename it onto ``path`` only if the block succeeds."""
    path = Path(path)
    if path.is_dir():
        from idckit.errors import ConfigError

        raise ConfigError(f"cannot write {path.name}: a directory of that name is in the way", path=path,
                          fix="choose another output path, or move that directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        from idckit.errors import ConfigError

        raise ConfigError(f"cannot write {path.name}: {_existing_ancestor(path)} is a file, not a directory",
                          path=path, fix="choose an output directory that is not a file") from e
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_umask())
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any, *, indent: int | None = None, sort_keys: bool = False) -> None:
    """Deterministic JSON (fixed separators, UTF-8) written atomically."""
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys, ensure_ascii=False,
                      separators=(",", ": ") if indent else (",", ":"))
    write_text(path, text + ("\n" if indent else ""))


def _existing_ancestor(path: Path) -> Path:
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


def check_output_file(path: str | Path, flag: str, example: str = "out.json") -> Path:
    """Refuse, before any work, an output file path that is a directory or lies under a file or a read-only place."""
    from idckit.errors import ConfigError

    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{flag} names a directory; it must be a file path", path=path,
                          fix=f"pass a file name, e.g. {flag} {path / example}")
    parent = _existing_ancestor(path)
    if not parent.is_dir():
        raise ConfigError(f"{flag} cannot be created: {parent} is a file, not a directory", path=path,
                          fix=f"choose a {flag} path inside a directory")
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"{flag} cannot be written: {parent} is not writable", path=path,
                          fix=f"choose a {flag} path in a directory you can write to")
    return path


def check_output_dir(path: str | Path, flag: str) -> Path:
    """Refuse, before any work, an output directory path that is a file or lies under a file or a read-only place."""
    from idckit.errors import ConfigError

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} names a file, not a directory", path=path,
                          fix=f"choose a directory path for {flag}")
    parent = path if path.is_dir() else _existing_ancestor(path)
    if not parent.is_dir():
        raise ConfigError(f"{flag} cannot be created: {parent} is a file, not a directory", path=path,
                          fix=f"choose a {flag} path inside a directory")
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"{flag} cannot be written: {parent} is not writable", path=path,
                          fix=f"choose a {flag} path you can write to")
    return path
