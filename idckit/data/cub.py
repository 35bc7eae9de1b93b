"""CUB-200-2011 (Wah et al., 2011) with the captions of Reed et al. (CVPR 2016), in their released layouts.

::

    ROOT/images/001.Black_footed_Albatross/<file>.jpg
    ROOT/images.txt               <image_id> <class_dir>/<file>.jpg       ids 1..N
    ROOT/classes.txt              <class_id> <class_dir>
    ROOT/image_class_labels.txt   <image_id> <class_id>
    ROOT/train_test_split.txt     <image_id> <is_training 0|1>
    ROOT/bounding_boxes.txt       <image_id> <x> <y> <w> <h>             (optional)
    TEXT/text_c10/<class_dir>/<file>.txt    10 captions, one a line     (Reed et al.; cvpr2016_cub/ or birds/text/)
    TEXT/{allclasses,trainvalclasses,testclasses,trainclasses,valclasses}.txt   zero-shot class splits (optional)

Every file is space separated. The caption file of an image is its ``images.txt`` path with ``.jpg`` replaced by
``.txt``. The zero-shot class lists are a different split from ``train_test_split.txt``; :meth:`Cub.images`
uses the latter, as IDC-PCL's GIC stage does.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from idckit.errors import DatasetError
from idckit.fileio import inside

REQUIRED = ("images.txt", "classes.txt", "image_class_labels.txt", "train_test_split.txt")
TEXT_DIRS = ("cvpr2016_cub", "birds/text", "text")

LAYOUT_HELP = (
    "expected CUB_200_2011/ with images/<class_dir>/<file>.jpg, images.txt, classes.txt, image_class_labels.txt, "
    "train_test_split.txt, and the Reed et al. captions as text_c10/<class_dir>/<file>.txt (see idckit/data/cub.py); "
    "generate a synthetic one with `idckit generate birds --out DIR`"
)


@dataclass(frozen=True)
class CubImage:
    image_id: int
    rel_path: str  # as in images.txt: <class_dir>/<file>.jpg
    path: Path
    class_id: int
    class_dir: str
    is_train: bool
    bbox: tuple[float, float, float, float] | None


def _table(path: Path, n_fields: int, help_: str = LAYOUT_HELP) -> list[list[str]]:
    """Space-separated rows; the last field keeps any further spaces. Blank lines are skipped."""
    if not path.is_file():
        raise DatasetError(f"missing file {path.name}", path=path, fix=help_)
    out = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split(maxsplit=n_fields - 1)
        if len(fields) != n_fields:
            raise DatasetError(f"line {line_no} has {len(fields)} fields, expected {n_fields}: {line!r}",
                               path=path, fix=help_)
        out.append(fields)
    return out


def _int(text: str, path: Path, what: str) -> int:
    try:
        return int(text)
    except ValueError as e:
        raise DatasetError(f"{what} {text!r} is not an integer", path=path, fix=LAYOUT_HELP) from e


class Cub:
    """A CUB-200-2011 root, with the Reed captions found beside it (or at ``text_root``)."""

    def __init__(self, root: str | Path, text_root: str | Path | None = None):
        root = Path(root)
        if root.is_dir() and not (root / "images.txt").is_file() and (root / "CUB_200_2011").is_dir():
            root = root / "CUB_200_2011"
        if not root.is_dir():
            raise DatasetError("CUB-200-2011 root is not a directory", path=root, fix=LAYOUT_HELP)
        if not (root / "images").is_dir():
            raise DatasetError("missing folder images/", path=root / "images", fix=LAYOUT_HELP)
        for name in REQUIRED:
            if not (root / name).is_file():
                raise DatasetError(f"missing file {name}", path=root / name, fix=LAYOUT_HELP)
        self.root = root
        self._text_root = None if text_root is None else Path(text_root)

    @cached_property
    def classes(self) -> dict[int, str]:
        path = self.root / "classes.txt"
        return {_int(i, path, "class id"): name for i, name in _table(path, 2)}

    @cached_property
    def _images(self) -> list[CubImage]:
        p_img, p_lab, p_split = (self.root / n for n in REQUIRED[:1] + REQUIRED[2:])
        labels = {_int(i, p_lab, "image id"): _int(c, p_lab, "class id") for i, c in _table(p_lab, 2)}
        train = {}
        for i, flag in _table(p_split, 2):
            if flag not in ("0", "1"):
                raise DatasetError(f"is_training must be 0 or 1, got {flag!r}", path=p_split, fix=LAYOUT_HELP)
            train[_int(i, p_split, "image id")] = flag == "1"
        boxes = {}
        p_box = self.root / "bounding_boxes.txt"
        if p_box.is_file():
            for i, *xywh in _table(p_box, 5):
                try:
                    boxes[_int(i, p_box, "image id")] = tuple(float(v) for v in xywh)
                except ValueError as e:
                    raise DatasetError(f"non-numeric box for image {i}", path=p_box, fix=LAYOUT_HELP) from e
        out = []
        for i, rel in _table(p_img, 2):
            iid = _int(i, p_img, "image id")
            if iid not in labels or iid not in train:
                missing = "image_class_labels.txt" if iid not in labels else "train_test_split.txt"
                raise DatasetError(f"image {iid} ({rel}) is not listed in {missing}", path=self.root / missing,
                                   fix=LAYOUT_HELP)
            cls = labels[iid]
            if cls not in self.classes:
                raise DatasetError(f"image {iid} has class {cls}, which classes.txt does not list",
                                   path=self.root / "classes.txt", fix=LAYOUT_HELP)
            class_dir = rel.split("/", 1)[0]
            path = inside(self.root / "images", rel, source=p_img, entry=f"image {iid}")
            out.append(CubImage(iid, rel, path, cls, class_dir, train[iid], boxes.get(iid)))
        return out

    def images(self, split: str | None = None) -> list[CubImage]:
        """All images, or those of ``train`` / ``test`` by ``train_test_split.txt``, in ``images.txt`` order."""
        if split not in (None, "train", "test"):
            raise DatasetError(f"unknown split {split!r}; CUB has train and test", path=self.root / REQUIRED[3])
        return [im for im in self._images if split is None or im.is_train == (split == "train")]

    # -- captions --------------------------------------------------------------------------------------
    @cached_property
    def text_root(self) -> Path:
        """The folder holding ``text_c10/``: ``text_root`` if given, else searched beside and inside ROOT."""
        candidates = [self._text_root] if self._text_root is not None else \
            [base / d for base in (self.root, self.root.parent) for d in TEXT_DIRS] + [self.root]
        for c in candidates:
            if (c / "text_c10").is_dir():
                return c
        raise DatasetError("no text_c10/ folder with the Reed et al. captions", path=candidates[0],
                           fix="pass text_root=the folder that holds text_c10/ (cvpr2016_cub/ or birds/text/); "
                               + LAYOUT_HELP)

    def captions(self, image: CubImage) -> list[str]:
        """The image's captions (10 in the release), stripped, blank lines dropped."""
        path = self.text_root / "text_c10" / (image.rel_path.rsplit(".", 1)[0] + ".txt")
        if not path.is_file():
            raise DatasetError(f"image {image.image_id} has no caption file", path=path,
                               fix="every image needs text_c10/<class_dir>/<file>.txt; " + LAYOUT_HELP)
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def caption_pairs(self, split: str | None = None) -> list[tuple[CubImage, str]]:
        """(image, caption) for every caption: the single-image text of the GIC pre-training stage."""
        return [(im, c) for im in self.images(split) for c in self.captions(im)]

    def class_list(self, name: str) -> list[str]:
        """A zero-shot class list (``trainvalclasses``, ``testclasses`` ...) of the caption release."""
        path = self.text_root / f"{name}.txt"
        if not path.is_file():
            raise DatasetError(f"no class list {name}.txt", path=path, fix=LAYOUT_HELP)
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
