"""The kit's own exception types.

Every error a user can meet (missing files, wrong layout, malformed JSON, no Java, no weights offline) is
raised as an ``IdckitError`` whose message names the path, what was expected, and how to fix it, and is
raised before any output is written.
"""
from __future__ import annotations

import errno
import re
from pathlib import Path


class IdckitError(Exception):
    """Base class: a problem the user can fix; the message says how."""

    def __init__(self, message: str, *, path: str | Path | None = None, fix: str | None = None):
        self.path = None if path is None else Path(path)
        self.fix = fix
        parts = [message]
        if path is not None:
            parts.append(f"  path: {path}")
        if fix:
            parts.append(f"  fix:  {fix}")
        super().__init__("\n".join(parts))


class DatasetError(IdckitError):
    """A dataset on disk does not have the expected layout or content."""


class ResultsError(IdckitError):
    """A results file (RCC format) is missing, malformed, or does not match the dataset."""


class MissingDependencyError(IdckitError):
    """A system or Python dependency (Java, a package, model data) is not available."""


class WeightsUnavailableError(IdckitError):
    """Pretrained weights cannot be loaded (offline, or the file is missing)."""


class ConfigError(IdckitError):
    """A configuration or profile is unknown or inconsistent."""


class ResourceError(IdckitError):
    """The machine said no: a full disk or quota, a file-size limit, a read-only place, a name too long, too many
    open files, too little memory or a file the user may not read."""


#: errno -> (what happened, the fix); the errors a resource limit raises, whatever the command was doing
_OS_LIMITS = {
    "ENOSPC": ("no space left on the device", "free space there (or write elsewhere: --out, IDCKIT_DATA_DIR, "
                                              "IDCKIT_RUNS_DIR) and run the command again (training and feature "
                                              "extraction resume where they stopped)"),
    "EDQUOT": ("the disk quota is exceeded", "free space within your quota (or write elsewhere: --out, "
                                             "IDCKIT_DATA_DIR, IDCKIT_RUNS_DIR) and run the command again"),
    "EFBIG": ("the file would exceed the file-size limit", "raise the limit (`ulimit -f unlimited`) or write to a "
                                                           "filesystem that takes larger files"),
    "EROFS": ("the place is on a read-only filesystem", "choose an output path on a writable filesystem"),
    "EACCES": ("permission denied", "give your user access to that path (chmod / chown), or choose another path"),
    "EPERM": ("the operation is not permitted (permission denied)", "give your user access to that path (chmod / "
                                                                    "chown), or choose another path"),
    "ENAMETOOLONG": ("a file name is too long for the filesystem", "choose a shorter path (at most 255 bytes per "
                                                                   "name)"),
    "EMFILE": ("too many open files for this process", "raise the limit (`ulimit -n 4096`) and run the command "
                                                       "again"),
    "ENFILE": ("too many open files on this machine", "close other programs' files, or raise the system's limit "
                                                      "(fs.file-max), and run the command again"),
}


def os_error_in(err: BaseException) -> OSError | None:
    """The OSError behind ``err``: itself, or the one a RuntimeError wraps (torch's file writer reports a failed
    write, a full disk included, as a RuntimeError raised while handling the OSError)."""
    seen = set()
    while isinstance(err, RuntimeError) and id(err) not in seen:
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return err if isinstance(err, OSError) else None


def resource_error(err: BaseException) -> ResourceError | None:
    """The kit's error for a resource limit the OS raised (:data:`_OS_LIMITS`, or an out-of-memory), or None for
    anything else: the one translation the CLI boundary applies, so every command says the same."""
    # numpy's allocation error is a MemoryError; torch's are RuntimeErrors (its CPU allocator's, CUDA's
    # OutOfMemoryError)
    if isinstance(err, MemoryError) or (isinstance(err, RuntimeError) and (
            type(err).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(err))):
        asked = re.search(r"tried to allocate (\d+) bytes", str(err))     # torch's; numpy's says it in GiB
        detail = f" ({int(asked[1]) / 2 ** 30:.1f} GiB asked for)" if asked else f" ({str(err)[:300]})" if str(err) \
            else ""
        return ResourceError(f"out of memory{detail}",
                             fix="use smaller sizes (--size, --image-size, --batch-size, --pairs), close other "
                                 "programs, or run on a machine with more memory")
    err = os_error_in(err)
    if err is None or err.errno is None:
        return None
    name = errno.errorcode.get(err.errno, "")
    if name not in _OS_LIMITS:
        return None
    what, fix = _OS_LIMITS[name]
    written = "; nothing half-written is kept" if name in ("ENOSPC", "EDQUOT", "EFBIG", "EROFS") else ""
    return ResourceError(f"{what}{written}", path=err.filename, fix=fix)
