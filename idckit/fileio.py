"""Atomic file writes and the one write policy of every command.

A reader never sees a half-written file, a killed process never leaves one; a command never overwrites or
deletes what it did not write (see ``claim_dir``).

Files get the permissions any ``open(path, "w")`` would give (0666 minus the umask): ``mkstemp`` creates its
temporary file 0600, which would otherwise survive the rename and hide reports and the README from other users.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from idckit.errors import ConfigError, DatasetError, os_error_in


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
        raise ConfigError(f"cannot write {path.name}: a directory of that name is in the way", path=path,
                          fix="choose another output path, or move that directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        raise ConfigError(f"cannot write {path.name}: {_existing_ancestor(path)} is a file, not a directory",
                          path=path, fix="choose an output directory that is not a file") from e
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_umask())
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:     # a full disk or a limit: the error names the user's file, not the temp
        cause = os_error_in(e)
        if cause is not None and (cause.filename is None or cause.filename in (str(tmp), tmp)):
            cause.filename = str(path)     # (a failed write() names no file at all)
        raise
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


_KINDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "an object",
          list: "a list"}


def _is(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


_JSON_KINDS = {dict: "object", list: "list"}


def read_json(path: str | Path, expect: type, *, what: str, fix: str, error: type = ConfigError,
              unreadable: bool = False) -> Any:
    """The JSON file ``path`` holding a JSON ``expect`` (dict: an object, or list), else ``error`` naming ``what``, the
    path and ``fix``: the one reader of a file a hand edit or a damaged disk can break. ``unreadable``: an OSError
    is that error too (otherwise it reaches the CLI boundary, which names the path and the limit hit)."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{what} is not valid JSON in UTF-8 ({e})", path=path, fix=fix) from e
    except OSError as e:
        if not unreadable:
            raise
        raise error(f"{what} is unreadable ({e})", path=path, fix=fix) from e
    if not isinstance(obj, expect):
        raise error(f"{what} must hold a JSON {_JSON_KINDS[expect]}, not {type(obj).__name__}", path=path, fix=fix)
    return obj


def read_run_file(path: str | Path, need: Mapping[str, type], *, may: Mapping[str, type] | None = None,
                  fix: str) -> dict[str, Any]:
    """A run's own JSON file (``config.json``, ``fit.json``) as a dict holding every key of ``need`` with a value of
    its type, and (when ``may`` is given) no key outside ``need`` and ``may``; otherwise the kit's error naming the
    file, the key, what was expected and ``fix``. The kit wrote the file, but a hand edit or a damaged disk can
    leave anything in it."""
    path = Path(path)
    obj = read_json(path, dict, what=f"the run's {path.name}", fix=fix)
    missing = [k for k in need if k not in obj]
    if missing:
        raise ConfigError(f"the run's {path.name} lacks {', '.join(missing)}", path=path, fix=fix)
    kinds = {**need, **(may or {})}
    for key, kind in kinds.items():
        if key in obj and not _is(obj[key], kind):
            raise ConfigError(f"the run's {path.name} has {key} = {json.dumps(obj[key])[:60]}; expected "
                              f"{_KINDS.get(kind, kind.__name__)}", path=path, fix=fix)
    unknown = sorted(set(obj) - set(kinds)) if may is not None else []
    if unknown:
        raise ConfigError(f"the run's {path.name} holds keys the kit does not write: {', '.join(unknown)}",
                          path=path, fix=fix)
    return obj


def _existing_ancestor(path: Path) -> Path:
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


def check_output_file(path: str | Path, flag: str, example: str = "out.json") -> Path:
    """Refuse, before any work, an output file path that is a directory or lies under a file or a read-only place."""
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


# -- the write policy: what a command may write into, and how ------------------------------------------------
# A command writes only into a folder that is absent, empty, or marked as its own output of the same kind; it
# replaces only the entries it owns and refuses when anything else is there. ``force`` lets it write beside
# foreign entries, never delete or replace them. Datasets and stores written before the marker existed are
# recognised by a ``recognise`` function of their command (their own files say what they are).
OWNER_FILE = ".idckit-output.json"
_STAGING, _TRASH, LOCK = ".idckit-staging-", ".idckit-trash-", ".idckit-lock-"


def _error(message: str, path, fix: str, cls: type | None = None):
    return (cls or ConfigError)(message, path=path, fix=fix)


def resolve_out(path: str | Path, flag: str, *, directory: bool = True, must_write: bool = True,
                error: type | None = None) -> Path:
    """``path`` resolved (``.``, ``..``, symlinks) and checked before any work: a dangling link, a link loop, a file
    where a folder is wanted (or the reverse), a path under a file and a read-only place are refused here."""
    raw = Path(path).expanduser()
    if raw.is_symlink() and not raw.exists():
        try:
            raw.resolve(strict=True)
            why = "a symbolic link that cannot be followed"
        except (RuntimeError, OSError) as e:
            why = ("a symbolic link loop" if "loop" in str(e).lower() or getattr(e, "errno", 0) == 40
                   else f"a dangling symbolic link (to {os.readlink(raw)}, which does not exist)")
        raise _error(f"{flag} is {why}", raw, f"pass a real {'directory' if directory else 'file'} path for {flag}, "
                                              "or fix the link", error)
    try:
        resolved = raw.resolve(strict=False)
    except (RuntimeError, OSError) as e:    # a loop in an ancestor: RuntimeError on 3.11, OSError on 3.13
        raise _error(f"{flag} cannot be resolved ({e})", raw, f"pass a {flag} path without a symbolic link loop",
                     error) from e
    if resolved == Path(resolved.anchor):
        raise _error(f"{flag} is the filesystem root", raw, f"pass a folder of its own for {flag}", error)
    if directory and resolved.exists() and not resolved.is_dir():
        raise _error(f"{flag} names a file, not a directory ({resolved.name} is a file)", raw,
                     f"choose a directory path for {flag}", error)
    if not must_write and resolved.is_dir():   # a folder that may only be read (reused): its writability is checked
        return resolved                         # when a write is due
    return check_output_dir(resolved, flag) if directory else check_output_file(resolved, flag)


def _entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def read_owner(directory: Path) -> dict | None:
    """The owner marker of ``directory`` ({"kind", "identity", "entries"}), or None when there is none or it is not
    one the kit wrote."""
    try:
        owner = json.loads((directory / OWNER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(owner, dict) or not isinstance(owner.get("kind"), str) or \
            not isinstance(owner.get("entries"), list):
        return None
    return owner


def _is_bookkeeping(name: str) -> bool:
    return name == OWNER_FILE or name.startswith((_STAGING, _TRASH, LOCK))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_staging(directory: Path, prefix: str) -> None:
    """Staging folders ``<prefix><pid>`` of processes that no longer run (killed): never read, only removed."""
    if not directory.is_dir():
        return
    for p in directory.iterdir():
        if p.name.startswith(prefix) and p.name[len(prefix):].isdigit() and not _pid_alive(int(p.name[len(prefix):])):
            shutil.rmtree(p, ignore_errors=True)


@dataclass
class Claim:
    """A folder a command may write into: ``previous`` is the owner record of what is there (None: nothing), and
    ``foreign`` the entries it did not write, which it keeps."""
    path: Path
    kind: str
    previous: dict | None
    foreign: list[str]

    flag: str = "--out"
    what: str = ""
    will_write: Sequence[str] = ()
    error: type | None = None        # the error class the command raises for its outputs (default ConfigError)
    foreign_note: str = ""           # what a folder without the command's marker lacks, said in the refusal
    force_option: str = "--force"    # how this command is told to write beside them ("": it cannot be)

    def check(self, force: bool) -> None:
        """Refuse (nothing written or deleted) a folder holding entries the command did not write, unless ``force``
        (they are then kept); entries of a name the command writes are in the way even then."""
        path, flag = self.path, self.flag
        if self.foreign and not force:
            shown = ", ".join(self.foreign[:5]) + (f" and {len(self.foreign) - 5} more" if len(self.foreign) > 5 else "")
            whose = f"a {self.what} idckit wrote, and also holds" if self.previous else \
                f"a folder idckit did not write{self.foreign_note}: it holds"
            beside = f", or pass {self.force_option} to write beside them (they are kept, never replaced)" \
                if self.force_option else ""
            raise _error(f"{flag} is {whose} {shown}; nothing was written or deleted", path,
                         f"choose a new or empty folder for {flag}, move those entries away{beside}", self.error)
        blocked = sorted(set(self.foreign) & set(self.will_write))
        if blocked:
            raise _error(f"{flag} holds {', '.join(blocked)}, which this command would have to replace but did "
                         "not write; nothing was written or deleted", path,
                         f"move {', '.join(blocked)} away, or choose another {flag}", self.error)
        check_output_dir(path, flag)

    def staging(self, last: Sequence[str] = ()) -> "_Staging":
        """The per-process folder to write into (entries named in ``last`` are moved into place last)."""
        return _Staging(self, last)


def claim_dir(path: str | Path, kind: str, *, flag: str = "--out", force: bool = False,
              recognise: Callable[[Path], dict | None] | None = None, will_write: Sequence[str] = (),
              what: str | None = None, check: bool = True, error: type | None = None,
              foreign_note: str = "", force_option: str = "--force") -> Claim:
    """Check, before any work, that the command writing ``kind`` may write into ``path`` (see the policy above).

    ``recognise(dir)`` gives an owner record for the command's outputs written before the marker; ``will_write``:
    top-level names the command writes (a foreign entry of that name is in the way even with ``force``);
    ``check=False`` leaves :meth:`Claim.check` to the caller (a command that may reuse what is there, writing
    nothing, checks only when it writes)."""
    what = what or kind
    path = resolve_out(path, flag, must_write=False, error=error)
    if not path.exists():
        c = Claim(path, kind, None, [], flag, what, tuple(will_write), error, foreign_note, force_option)
    else:
        names = [n for n in _entries(path) if not _is_bookkeeping(n)]
        owner = (read_owner(path) or (recognise(path) if recognise else None)) if names else None
        if owner is not None and owner.get("kind") != kind:
            raise _error(f"{flag} holds a {owner.get('what') or owner.get('kind')} that idckit wrote, not a {what}; "
                         "nothing was written", path, f"choose another {flag} (a new or empty folder)", error)
        owned = set(owner["entries"]) if owner else set()
        c = Claim(path, kind, owner, [n for n in names if n not in owned], flag, what, tuple(will_write), error,
                  foreign_note, force_option)
    if check:
        c.check(force)
    return c


class _Staging:
    """A fresh per-process folder the command writes into; on success its entries replace the owned ones in the
    claimed folder (the whole folder is renamed into place when it did not exist). On any failure, Ctrl-C
    included, the staging folder is removed; one left by a killed process is never read, only removed later."""

    def __init__(self, claim: Claim, last: Sequence[str] = ()):
        self.claim, self.last = claim, tuple(last)
        out = claim.path
        self.inside = out.is_dir()
        base = out if self.inside else out.parent
        if not self.inside:
            base.mkdir(parents=True, exist_ok=True)
            remove_stale_staging(base, f"{_STAGING}{out.name}-")
        self.dir = base / (f"{_STAGING}{os.getpid()}" if self.inside else f"{_STAGING}{out.name}-{os.getpid()}")

    def __enter__(self) -> Path:
        if self.inside:
            remove_stale_staging(self.claim.path, _STAGING)
            remove_stale_staging(self.claim.path, _TRASH)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        return self.dir

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc_type is None:
                self.publish(self.last)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
        cause = None if exc is None else os_error_in(exc)
        if cause is not None and (cause.filename is None or str(cause.filename).startswith(str(self.dir))):
            cause.filename = str(self.claim.path)   # a full disk names the output folder, not the staging removed
        return False

    def publish(self, last: Sequence[str] = ()) -> None:
        claim, out = self.claim, self.claim.path
        new = [n for n in _entries(self.dir) if n not in last] + [n for n in last if (self.dir / n).exists()]
        owner = {"kind": claim.kind, "what": claim.what, "entries": sorted(new)}
        if not self.inside:
            write_json(self.dir / OWNER_FILE, owner, indent=1)
            os.replace(self.dir, out)
            return
        # the marker goes first and comes back last: a process killed mid-swap leaves a folder nothing trusts
        current = [n for n in _entries(out) if not _is_bookkeeping(n)]
        in_the_way = sorted(set(new) & set(current) & set(claim.foreign))
        if in_the_way:   # appeared while we worked
            raise _error(f"{', '.join(in_the_way)} appeared in the output folder while this command ran and would be "
                         "replaced; nothing was replaced", out, "move them away and run the command again")
        trash = out / f"{_TRASH}{os.getpid()}"
        trash.mkdir(exist_ok=True)
        try:
            if (out / OWNER_FILE).exists():
                os.replace(out / OWNER_FILE, trash / OWNER_FILE)
            old = set(claim.previous["entries"]) if claim.previous else set()
            for name in sorted(old & set(current)):
                os.replace(out / name, trash / name)
            for name in new:
                os.replace(self.dir / name, out / name)
            write_json(out / OWNER_FILE, owner, indent=1)
        finally:
            shutil.rmtree(trash, ignore_errors=True)


def torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` through a Python file, so that a failed write (a full disk, a file-size limit) keeps its OSError
    (as the context of torch's RuntimeError); torch's own file writer would say only "unexpected pos"."""
    import torch  # local: torch costs 2 s CPU at import; reports and the CLI use fileio without it

    with open(path, "wb") as f:
        torch.save(obj, f)


def copy_file(src: str | Path, dst: str | Path) -> None:
    """A copy that appears at ``dst`` complete or not at all."""
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)


def sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (hex), read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve() or os.path.samefile(a, b)
    except OSError:
        return False


def refuse_input_as_output(out: str | Path, flag: str, inputs: Sequence[str | Path], *, fix: str,
                           error: type | None = None) -> None:
    """An output path that is one of the command's inputs, or lies inside an input folder, is refused."""
    out_r = Path(out).expanduser().resolve()
    for src in inputs:
        src_r = Path(src).expanduser().resolve()
        if out_r == src_r or same_file(out_r, src_r):
            raise _error(f"{flag} is a file this command reads; it would be overwritten", out, fix, error)
        if src_r.is_dir() and src_r in out_r.parents:
            raise _error(f"{flag} lies inside {src_r}, which this command reads; outputs never go into its inputs",
                         out, fix, error)


@contextmanager
def lock(directory: Path, name: str, *, what: str, fix: str) -> Iterator[None]:
    """An exclusive lock on ``name`` in ``directory`` for the block; a second process is refused at once, naming
    the first. The kernel drops the lock when its holder exits, however it exits, so a killed run blocks nothing."""
    import fcntl  # local: POSIX-only; the rest of fileio imports on any system

    path = directory / f"{LOCK}{name}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666 & ~_umask())
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
            raise _error(f"{what} is in use by process {holder}; nothing was written", directory, fix) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)


@contextmanager
def wait_lock(path: Path) -> Iterator[None]:
    """An exclusive lock held for a short read-modify-write (a second process waits for it)."""
    import fcntl  # local: POSIX-only; the rest of fileio imports on any system

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666 & ~_umask())
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def claim_file(path: str | Path, flag: str, *, inputs: Sequence[str | Path] = (),
               recognise: Callable[[Path], bool] | None = None, what: str, error: type | None = None) -> Path:
    """An output file resolved and checked before any work: never one of the command's inputs nor inside an input
    folder, and an existing file only when ``recognise`` says it is this command's own earlier output (``what``);
    a file the kit did not write is never replaced (no flag overrides this: replacing it would delete it)."""
    path = resolve_out(path, flag, directory=False, error=error)
    refuse_input_as_output(path, flag, inputs, fix=f"choose a {flag} path outside the command's inputs", error=error)
    if path.exists() and not (recognise is not None and recognise(path)):
        raise _error(f"{flag} is an existing file that is not {what}; nothing was written", path,
                     f"choose a new file for {flag}, or move that one away", error)
    return path


def inside(base: Path, name: str, *, source: Path, entry: str) -> Path:
    """``base / name`` for a file name read from a dataset's own files (``source``, at ``entry``), refused when the
    name is absolute or climbs out of ``base`` with ``..``: a dataset file never makes the kit open another place."""
    norm = os.path.normpath(name)
    if os.path.isabs(name) or norm == ".." or norm.startswith(".." + os.sep) or not name.strip():
        raise DatasetError(f"{entry} names {name!r}, which is not a path inside {base}", path=source,
                           fix="image names in a dataset's files must be relative paths inside the dataset (no "
                               "leading /, no ..); correct the entry or re-download the dataset")
    return base / name
