"""Images for models that read raw pixels (CLIP4IDC): decoded and resized once, kept as uint8, normalised per batch.

CLIP4IDC trains on pixels, so every step needs images at the CLIP input size. Decoding PNGs and resizing them
at every step (the public code's 4 loader workers) would cost more than the small stand-in ViT itself on a CPU,
so :class:`ImageCache` does it once: ``[N, 3, S, S]`` uint8 in memory (6,000 synthetic images at 112 px are
226 MB), rows addressed by the image's path relative to the dataset root. Normalisation (CLIP's mean/std) happens
per batch in :meth:`ImageCache.batch`.

Resizing follows the public code's ``rawimage_util.py``: RGB, bicubic, straight to S x S without keeping the
aspect ratio ("squash"; a centre crop would cut objects off the sides of CLEVR's 3:2 images).

Every image the kit reads (these pixels, the IDC-PCL features, ``idckit caption``, the plots and baselines) goes
through :func:`load_image`: any mode and bit depth to 8-bit RGB, scaled right or refused with the path.

On disk (optional ``cache_dir``): ``images.npy`` (uint8, np.lib.format) + ``index.json`` (relative path -> row)
+ ``meta.json`` (size, count, complete), written atomically, so notebooks in separate kernels share one decode.
"""
from __future__ import annotations

import hashlib
import json
import struct
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from tqdm.auto import tqdm

from idckit import fileio
from idckit.device import copy_to
from idckit.errors import DatasetError
from idckit.train import distributed

#: OpenAI CLIP's normalisation (open_clip's OPENAI_DATASET_MEAN/STD), used by every CLIP incl. the stand-in.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


#: Pillow's 16-bit greyscale modes. Pillow reads a 16-bit RGB PNG as 8-bit RGB by keeping each value's high byte, so
#: these keep the high byte too: the same picture saved either way gives the same pixels.
GREY16 = ("I;16", "I;16B", "I;16L", "I;16N")


def load_image(path: str | Path):
    """An image file as an 8-bit RGB PIL image, or a :class:`DatasetError` naming the path.

    * 8-bit modes (1, L, P, LA, PA, RGB, RGBA, RGBX, CMYK, YCbCr, HSV, LAB) convert as Pillow converts them; alpha
      is dropped, not composited, as both papers' loaders do.
    * 16-bit greyscale (I;16, I;16B, ...): the high byte of each value (``v >> 8``).
    * 32-bit integers (I): values within 0..255 as they are, within 0..65535 as 16-bit; any other range is refused.
    * 32-bit floats (F): values within [0, 1] as fractions of white, within [0, 255] as 8-bit levels (rounded);
      any other range, NaN or infinity is refused.
    * A file of several frames (animated GIF/PNG/WebP, multi-page TIFF): its first frame.
    * EXIF orientation is not applied: the pixels as stored, as the authors' loaders read them.

    A file that is not a whole image (truncated, not an image, too many pixels to decode safely) is refused."""
    path = Path(path)
    try:
        with Image.open(path) as im:
            im.seek(0)
            im.load()     # the whole first frame: a truncated file fails here, not later
            return _to_rgb(im, path)
    except FileNotFoundError as e:
        raise DatasetError("image file not found", path=path,
                           fix="check the path; for a dataset, `idckit verify-data ROOT` names what its layout lacks") from e
    except IsADirectoryError as e:
        raise DatasetError("a directory, not an image file", path=path, fix="pass the path of an image file") from e
    except PermissionError as e:
        raise DatasetError("image file not readable (permission denied)", path=path,
                           fix="make it readable (chmod a+r) or copy it somewhere you can read") from e
    except Image.DecompressionBombError as e:
        raise DatasetError(f"image too large to decode safely ({e})", path=path,
                           fix="resize it to a few thousand pixels a side (CLEVR's images are 480 x 320)") from e
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError, struct.error) as e:
        # Pillow reports a damaged file with any of these, depending on the format
        raise DatasetError(f"unreadable image ({type(e).__name__}: {e})", path=path,
                           fix="re-download or re-generate this image (PIL cannot decode it)") from e


def _to_rgb(im, path: Path):
    if im.mode in GREY16 or im.mode in ("I", "F"):
        return Image.fromarray(_levels(np.asarray(im), im.mode, path), "L").convert("RGB")
    try:
        return im.convert("RGB")
    except ValueError as e:
        raise DatasetError(f"an image in Pillow mode {im.mode!r}, which has no conversion to RGB ({e})", path=path,
                           fix="save it as an 8-bit RGB or greyscale PNG") from e


def _levels(a: np.ndarray, mode: str, path: Path) -> np.ndarray:
    """A 16-bit, 32-bit integer or float greyscale array as 8-bit levels (:func:`load_image` says how)."""
    fix = "save it as an 8-bit or 16-bit PNG, scaled to the range you mean"
    if mode in GREY16:
        return (a.astype(np.uint32) >> 8).astype(np.uint8)
    if mode == "F" and not np.isfinite(a).all():
        raise DatasetError("a floating-point image with NaN or infinite pixels", path=path, fix=fix)
    lo, hi = (a.min(), a.max()) if a.size else (0, 0)
    if mode == "I":
        if lo >= 0 and hi <= 255:
            return a.astype(np.uint8)
        if lo >= 0 and hi <= 65535:
            return (a >> 8).astype(np.uint8)
        raise DatasetError(f"a 32-bit integer image with values {lo}..{hi}: neither 8-bit (0..255) nor 16-bit "
                           "(0..65535), so no scale to 8 bits is known", path=path, fix=fix)
    if lo >= 0 and hi <= 1:
        return np.rint(a.astype(np.float64) * 255).astype(np.uint8)
    if lo >= 0 and hi <= 255:
        return np.rint(a).astype(np.uint8)
    raise DatasetError(f"a floating-point image with values {lo:g}..{hi:g}: neither fractions of white (0..1) nor "
                       "8-bit levels (0..255), so no scale to 8 bits is known", path=path, fix=fix)


def resize_uint8(path: str | Path, size: int) -> np.ndarray:
    """[3, size, size] uint8: RGB, bicubic squash resize (no crop, aspect ratio not kept)."""
    img = load_image(path).resize((size, size), Image.BICUBIC)
    return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1).copy()


def _mapped(path: Path) -> torch.Tensor:
    """The cache file as a read-only memory-mapped tensor: a batch reads its rows, and the page cache holds the file
    once for every process of a machine (18 GB for CLEVR-Change at 224 px)."""
    with warnings.catch_warnings():   # read-only: nothing writes the pixels
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.load(path, mmap_mode="r"))


class ImageCache:
    """uint8 images at one square size, addressed by relative path; :meth:`batch` gives normalised floats."""

    def __init__(self, pixels: torch.Tensor, index: dict[str, int], mean=CLIP_MEAN, std=CLIP_STD):
        if pixels.dtype != torch.uint8 or pixels.ndim != 4 or pixels.shape[1] != 3:
            raise ValueError(f"pixels must be uint8 [N, 3, S, S], got {pixels.dtype} {tuple(pixels.shape)}")
        self.pixels, self.index = pixels, dict(index)
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)

    @property
    def size(self) -> int:
        return self.pixels.shape[-1]

    def __len__(self) -> int:
        return self.pixels.shape[0]

    def rows(self, rel_paths: Sequence[str]) -> torch.Tensor:
        return torch.tensor([self.index[p] for p in rel_paths], dtype=torch.long)

    def read(self, rows: torch.Tensor) -> torch.Tensor:
        """[B, 3, S, S] uint8 pixels of ``rows`` on the CPU (a DataLoader worker's part of :meth:`batch`)."""
        return self.pixels[rows.cpu()]

    def batch(self, rows: torch.Tensor, device: torch.device | str = "cpu",
              pixels: torch.Tensor | None = None) -> torch.Tensor:
        """Rows -> [B, 3, S, S] float32 on ``device``, scaled to [0, 1] and normalised with CLIP's mean/std.

        The uint8 pixels travel to the device (a quarter of the float32 bytes) and are converted there.
        ``pixels``: :meth:`read` of ``rows`` done ahead (by a DataLoader worker)."""
        x = copy_to(self.read(rows) if pixels is None else pixels, device).float().div_(255.0)
        return (x - self.mean.to(x.device)) / self.std.to(x.device)

    @classmethod
    def build(cls, root: str | Path, rel_paths: Sequence[str], size: int, *, cache_dir: str | Path | None = None,
              progress: bool = False) -> "ImageCache":
        """Decode and resize ``rel_paths`` (relative to ``root``); reuse ``cache_dir`` if it holds the same set.
        Under torchrun rank 0 writes the cache and the other ranks read it."""
        if cache_dir is not None and distributed.world() > 1:
            return distributed.main_first(lambda: cls._build(root, rel_paths, size, cache_dir=cache_dir,
                                                             progress=progress and distributed.is_main()))
        return cls._build(root, rel_paths, size, cache_dir=cache_dir, progress=progress)

    @classmethod
    def _build(cls, root, rel_paths, size, *, cache_dir, progress) -> "ImageCache":
        root = Path(root)
        paths = sorted(dict.fromkeys(rel_paths))
        digest = hashlib.sha256(("\n".join(paths) + f"\n{size}").encode()).hexdigest()[:16]
        if cache_dir is not None:
            cache_dir = Path(cache_dir)
            meta_path = cache_dir / "meta.json"
            if meta_path.is_file():
                try:
                    meta = json.loads(meta_path.read_text())
                    if meta.get("complete") and meta.get("digest") == digest:
                        index = json.loads((cache_dir / "index.json").read_text())
                        pixels = _mapped(cache_dir / "images.npy")
                        if tuple(pixels.shape) == (len(paths), 3, size, size):
                            return cls(pixels, index)
                except (OSError, ValueError, AttributeError):
                    pass  # a damaged cache (JSON or .npy) is only derived data: decode again below
        pixels = np.empty((len(paths), 3, size, size), dtype=np.uint8)
        for i, rel in enumerate(tqdm(paths, desc=f"images {size}px", disable=not progress, leave=False)):
            pixels[i] = resize_uint8(root / rel, size)
        index = {p: i for i, p in enumerate(paths)}
        if cache_dir is not None:
            with fileio.atomic_path(cache_dir / "images.npy") as tmp:
                with open(tmp, "wb") as f:
                    np.save(f, pixels)
            fileio.write_json(cache_dir / "index.json", index)
            fileio.write_json(cache_dir / "meta.json", {"size": size, "count": len(paths), "digest": digest,
                                                         "root": str(root), "complete": True}, indent=1)
            return cls(_mapped(cache_dir / "images.npy"), index)
        return cls(torch.from_numpy(pixels), index)
