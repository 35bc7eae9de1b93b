"""The one gate for every checkpoint file a user can hand the kit: :func:`load` reads it, :func:`check_state` and
:func:`load_into` refuse weights that are not exactly the model's.

:func:`load` reads with ``torch.load(weights_only=True)`` (tensors and plain containers only, no code runs), after
checking what the file declares: it lists every tensor storage the pickle asks for without building any (a stub
unpickler that imports nothing) and refuses a file whose storages add up to more bytes than the file holds, or than
the machine has free, before torch allocates them (a 4 MB file declaring 4 GiB is a truncated or crafted file, not
a checkpoint). A missing path, a directory, an empty file, a truncated or foreign file: one :class:`IdckitError`
naming the path and the caller's fix.

:func:`check_state` compares a state dict with the model's own: missing keys, unexpected keys, shapes that do not
fit, a number where a float belongs (or the reverse), NaN or Inf. A silently different model (an extra layer that
stays random, a head left at its initialisation) is what ``load_state_dict(strict=False)`` allows and this refuses.
"""
from __future__ import annotations

import contextlib
import io
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch

from idckit.errors import ConfigError, IdckitError

#: bytes per element of torch's pickled storage types (``torch.FloatStorage`` ...); unknown names count 8
_ITEMSIZE = {"Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
             "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "Untyped": 1, "QUInt8": 1, "QInt8": 1,
             "QInt32": 4, "QUInt4x2": 1, "QUInt2x4": 1}
#: the first pickle of torch's legacy (pre-zip) format
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
#: keys listed in an error, per kind of problem
SHOWN = 4


# -- reading -------------------------------------------------------------------------------------------------------
class _Stub:
    """Whatever a dry read meets: accepts every call and pickle operation, holds nothing, runs nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass


class _DryUnpickler(pickle.Unpickler):
    """Reads a checkpoint's pickle without importing or allocating anything: every global is a :class:`_Stub`
    subclass, every persistent id (a tensor storage) is recorded as (key, declared bytes)."""

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.storages: dict[str, int] = {}

    def find_class(self, module: str, name: str) -> Any:
        return type(name, (_Stub,), {"module": module})

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
            kind = getattr(pid[1], "__name__", "")
            item = _ITEMSIZE.get(kind.removesuffix("Storage"), 8)
            numel = pid[4] if isinstance(pid[4], int) else 0
            self.storages[str(pid[2])] = max(numel, 0) * item
        return _Stub()


def declared_storages(path: Path) -> dict[str, int] | None:
    """{storage key: declared bytes} of a torch checkpoint (zip or legacy format), read without building any
    tensor; None when the file is neither (torch's own error then says what it is)."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            pkl = [i for i in z.infolist() if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"]
            if len(pkl) != 1 or pkl[0].file_size > os.path.getsize(path) * 64:
                return None
            dry = _DryUnpickler(io.BytesIO(z.read(pkl[0])))
            dry.load()
            return dry.storages
    with open(path, "rb") as f:
        # the legacy format: magic number, protocol version, system info, then the object's pickle
        if _DryUnpickler(f).load() != _LEGACY_MAGIC:
            return None
        for _ in range(2):
            _DryUnpickler(f).load()
        dry = _DryUnpickler(f)
        dry.load()
        return dry.storages


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def load(path: str | Path, *, fix: str, what: str = "checkpoint", error: type[IdckitError] = ConfigError,
         safe_globals: Iterable[Any] = ()) -> Any:
    """The top-level object of the checkpoint at ``path``, read on CPU with ``weights_only=True`` once its declared
    sizes have been checked (module doc). Any problem: ``error`` naming ``path`` and ``fix``. ``safe_globals``:
    extra (callable, "module.name") pairs the file may name (see ``torch.serialization.safe_globals``)."""
    path = Path(path)
    check_declared(path, fix=fix, what=what, error=error)
    try:
        with torch.serialization.safe_globals(list(safe_globals)) if safe_globals else contextlib.nullcontext():
            return torch.load(path, map_location="cpu", weights_only=True)
    except MemoryError as e:
        raise error(f"the {what} does not fit in memory", path=path, fix=fix) from e
    except Exception as e:  # noqa: BLE001 - truncated zips, pickles with code and foreign files alike
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
        raise error(f"the file is not a readable PyTorch {what} ({type(e).__name__}: {first})", path=path,
                    fix=fix) from e


def check_declared(path: str | Path, *, fix: str, what: str = "checkpoint",
                   error: type[IdckitError] = ConfigError) -> None:
    """What :func:`load` checks before torch reads ``path`` (a file, not empty, its declared tensor bytes within
    the file's size and free memory), for loaders that hand the file to another library (open_clip)."""
    path = Path(path)
    if path.is_dir():
        raise error(f"the {what} is a directory, not a file", path=path, fix=fix)
    if not path.is_file():
        raise error(f"the {what} does not exist", path=path, fix=fix)
    size = path.stat().st_size
    if size == 0:
        raise error(f"the {what} is an empty file (0 bytes)", path=path, fix=fix)
    try:
        storages = declared_storages(path)
    except Exception:  # noqa: BLE001 - a pickle even a dry read cannot parse: torch.load below says why
        storages = None
    if storages:
        declared = sum(storages.values())
        if declared > size:
            raise error(f"the {what} declares {_size(declared)} of tensors but the file holds {_size(size)}: it is "
                        "truncated or crafted, and nothing was allocated", path=path, fix=fix)
        free = _available_memory()
        if free is not None and declared > free:
            raise error(f"the {what} needs {_size(declared)} of memory to load, {_size(free)} is free", path=path,
                        fix="free memory, or load it on a machine with more")


# -- checking ------------------------------------------------------------------------------------------------------
def _kind(t: Any) -> str:
    return "float" if t.is_floating_point() or t.is_complex() else "bool" if t.dtype == torch.bool else "integer"


def non_finite(state: Mapping[str, Any]) -> list[str]:
    """The keys of ``state``'s floating tensors that hold NaN or Inf, sorted."""
    return sorted(str(k) for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
                  and v.numel() and not bool(torch.isfinite(v).all()))


def listed(keys: list[str]) -> str:
    """The first :data:`SHOWN` of ``keys``, and how many there are when there are more."""
    more = f", ... ({len(keys)} in all)" if len(keys) > SHOWN else ""
    return ", ".join(keys[:SHOWN]) + more


def problems(state: Any, expected: Mapping[str, Any], *, allow_missing: Iterable[str] = ()) -> list[str]:
    """What keeps ``state`` from being exactly a state dict of the model whose own state dict is ``expected``
    (empty: it fits). ``allow_missing``: keys the caller fills itself (said in its own record)."""
    if not isinstance(state, Mapping):
        return [f"it holds a {type(state).__name__}, not a state dict (a mapping of names to tensors)"]
    out = []
    not_tensors = sorted(str(k) for k, v in state.items() if not isinstance(v, torch.Tensor))
    nested = [k for k in not_tensors if isinstance(state[k], Mapping)]
    if nested and not any(isinstance(v, torch.Tensor) for v in state.values()):
        return [f"its weights are nested under {listed([repr(k) for k in nested])}, not at the top level"]
    if not_tensors:
        out.append(f"values that are not tensors: {listed(not_tensors)}")
    allowed = set(allow_missing)
    missing = sorted(k for k in expected if k not in state and k not in allowed)
    extra = sorted(str(k) for k in state if k not in expected and isinstance(state[k], torch.Tensor))
    if missing:
        out.append(f"missing keys: {listed(missing)}")
    if extra:
        out.append(f"keys the model does not have: {listed(extra)}")
    shapes, kinds, bad = [], [], []
    for k, v in state.items():
        if k not in expected or not isinstance(v, torch.Tensor):
            continue
        own = expected[k]
        if tuple(v.shape) != tuple(own.shape):
            shapes.append(f"{k}: checkpoint {tuple(v.shape)}, model {tuple(own.shape)}")
        elif _kind(v) != _kind(own):
            kinds.append(f"{k}: checkpoint {str(v.dtype).removeprefix('torch.')}, model "
                         f"{str(own.dtype).removeprefix('torch.')}")
        elif _kind(v) == "float" and v.numel() and not bool(torch.isfinite(v).all()) \
                and bool(torch.isfinite(own).all()):
            bad.append(k)
    if shapes:
        out.append(f"shapes that do not fit: {listed(shapes)}")
    if kinds:
        out.append(f"tensors of the wrong kind: {listed(kinds)}")
    if bad:
        out.append(f"tensors holding NaN or Inf: {listed(bad)}")
    return out


def check_state(state: Any, expected: Mapping[str, Any], *, path: str | Path | None, fix: str,
                what: str = "checkpoint", error: type[IdckitError] = ConfigError,
                allow_missing: Iterable[str] = ()) -> None:
    """Refuse (``error`` naming ``path`` and ``fix``) unless ``state`` is exactly a state dict of the model whose
    own state dict is ``expected``: :func:`problems` lists what is wrong, the first few keys of each kind."""
    found = problems(state, expected, allow_missing=allow_missing)
    if found:
        raise error(f"the {what} does not fit the model: " + "; ".join(found), path=path, fix=fix)


def load_into(model: Any, state: Any, *, path: str | Path | None, fix: str, what: str = "checkpoint",
              error: type[IdckitError] = ConfigError) -> Any:
    """``model`` holding ``state`` (checked by :func:`check_state`, then loaded strictly); returns ``model``."""
    check_state(state, model.state_dict(), path=path, fix=fix, what=what, error=error)
    model.load_state_dict(state, strict=True)
    return model


__all__ = ["load", "check_declared", "declared_storages", "problems", "non_finite", "listed", "check_state", "load_into"]
