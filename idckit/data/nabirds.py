"""NABirds (Van Horn et al., CVPR 2015) in its released layout.

::

    ROOT/images/<4-digit class_id>/<32 hex>.jpg
    ROOT/images.txt              <uuid> <dir>/<file>.jpg
    ROOT/classes.txt             <class_id> <name with spaces>     every node of the taxonomy
    ROOT/hierarchy.txt           <child_id> <parent_id>
    ROOT/image_class_labels.txt  <uuid> <class_id>                 a leaf class
    ROOT/train_test_split.txt    <uuid> <is_training 0|1>
    ROOT/sizes.txt, bounding_boxes.txt                             (optional)

Image ids are UUID strings, not integers. ``classes.txt`` is split once on the first space. The leaf classes
(the labels; 555 in the release) are the nodes that are nobody's parent; :attr:`NABirds.label_index` numbers them
0..L-1 in class-id order for a classifier head.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from idckit.data.cub import _table
from idckit.errors import DatasetError
from idckit.fileio import inside

REQUIRED = ("images.txt", "classes.txt", "hierarchy.txt", "image_class_labels.txt", "train_test_split.txt")

LAYOUT_HELP = (
    "expected nabirds/ with images/<class_id>/<hex>.jpg, images.txt, classes.txt, hierarchy.txt, "
    "image_class_labels.txt and train_test_split.txt, images keyed by UUID (see idckit/data/nabirds.py); "
    "generate a synthetic one with `idckit generate birds --out DIR`"
)


@dataclass(frozen=True)
class NABirdsImage:
    uuid: str
    rel_path: str
    path: Path
    class_id: int
    is_train: bool


def _int(text: str, path: Path, what: str) -> int:
    try:
        return int(text)
    except ValueError as e:
        raise DatasetError(f"{what} {text!r} is not an integer", path=path, fix=LAYOUT_HELP) from e


def _uuid(text: str, path: Path) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError as e:
        raise DatasetError(f"image id {text!r} is not a UUID", path=path,
                           fix="NABirds image ids look like 0000139e-21dc-4d0c-bfe1-4cae3c85c829; "
                               + LAYOUT_HELP) from e


class NABirds:
    def __init__(self, root: str | Path):
        root = Path(root)
        if root.is_dir() and not (root / "images.txt").is_file() and (root / "nabirds").is_dir():
            root = root / "nabirds"
        if not root.is_dir():
            raise DatasetError("NABirds root is not a directory", path=root, fix=LAYOUT_HELP)
        if not (root / "images").is_dir():
            raise DatasetError("missing folder images/", path=root / "images", fix=LAYOUT_HELP)
        for name in REQUIRED:
            if not (root / name).is_file():
                raise DatasetError(f"missing file {name}", path=root / name, fix=LAYOUT_HELP)
        self.root = root

    # -- taxonomy --------------------------------------------------------------------------------------
    @cached_property
    def classes(self) -> dict[int, str]:
        path = self.root / "classes.txt"
        return {_int(i, path, "class id"): name for i, name in _table(path, 2, LAYOUT_HELP)}

    @cached_property
    def parent(self) -> dict[int, int]:
        path = self.root / "hierarchy.txt"
        out = {}
        for c, p in _table(path, 2, LAYOUT_HELP):
            c, p = _int(c, path, "child id"), _int(p, path, "parent id")
            for node in (c, p):
                if node not in self.classes:
                    raise DatasetError(f"hierarchy.txt names class {node}, which classes.txt does not list",
                                       path=path, fix=LAYOUT_HELP)
            out[c] = p
        return out

    def ancestors(self, class_id: int) -> list[int]:
        """``class_id``'s parent, grandparent, ... up to the root (cycles raise)."""
        out, node = [], class_id
        while node in self.parent:
            node = self.parent[node]
            if node in out or node == class_id:
                raise DatasetError(f"hierarchy.txt has a cycle through class {node}",
                                   path=self.root / "hierarchy.txt", fix=LAYOUT_HELP)
            out.append(node)
        return out

    @cached_property
    def leaf_classes(self) -> list[int]:
        parents = set(self.parent.values())
        return sorted(c for c in self.classes if c not in parents)

    @cached_property
    def label_index(self) -> dict[int, int]:
        """Leaf class id -> 0..L-1."""
        return {c: k for k, c in enumerate(self.leaf_classes)}

    # -- images ----------------------------------------------------------------------------------------
    @cached_property
    def _images(self) -> list[NABirdsImage]:
        p_img, p_lab, p_split = (self.root / n for n in ("images.txt", "image_class_labels.txt",
                                                          "train_test_split.txt"))
        labels = {_uuid(u, p_lab): _int(c, p_lab, "class id") for u, c in _table(p_lab, 2, LAYOUT_HELP)}
        train = {}
        for u, flag in _table(p_split, 2, LAYOUT_HELP):
            if flag not in ("0", "1"):
                raise DatasetError(f"is_training must be 0 or 1, got {flag!r}", path=p_split, fix=LAYOUT_HELP)
            train[_uuid(u, p_split)] = flag == "1"
        leaves = set(self.leaf_classes)
        out = []
        for u, rel in _table(p_img, 2, LAYOUT_HELP):
            u = _uuid(u, p_img)
            if u not in labels or u not in train:
                missing = "image_class_labels.txt" if u not in labels else "train_test_split.txt"
                raise DatasetError(f"image {u} is not listed in {missing}", path=self.root / missing,
                                   fix=LAYOUT_HELP)
            if labels[u] not in leaves:
                raise DatasetError(f"image {u} is labelled {labels[u]}, which is not a leaf class of hierarchy.txt",
                                   path=p_lab, fix=LAYOUT_HELP)
            out.append(NABirdsImage(u, rel, inside(self.root / "images", rel, source=p_img, entry=f"image {u}"),
                                    labels[u], train[u]))
        return out

    def images(self, split: str | None = None) -> list[NABirdsImage]:
        if split not in (None, "train", "test"):
            raise DatasetError(f"unknown split {split!r}; NABirds has train and test",
                               path=self.root / "train_test_split.txt")
        return [im for im in self._images if split is None or im.is_train == (split == "train")]


def sample_pairs(images: list[NABirdsImage], n: int, *, seed: int = 0, same_fraction: float = 0.5):
    """``n`` image pairs, ``same_fraction`` of them from one class: IDC-PCL's FGVC-stage records
    ``{img1, img2, class_id1, class_id2, label}`` (label 1 = same class), drawn reproducibly from ``seed``."""
    rng = np.random.default_rng(seed)
    by_class: dict[int, list[NABirdsImage]] = {}
    for im in images:
        by_class.setdefault(im.class_id, []).append(im)
    multi = [c for c in sorted(by_class) if len(by_class[c]) >= 2]
    if not multi or len(by_class) < 2:
        raise DatasetError("pair sampling needs two classes and a class with two images", path=None,
                           fix="use more NABirds images")
    out = []
    for _ in range(n):
        if rng.random() < same_fraction:
            c = multi[int(rng.integers(len(multi)))]
            i, j = rng.choice(len(by_class[c]), size=2, replace=False)
            a, b = by_class[c][int(i)], by_class[c][int(j)]
        else:
            k, l_ = rng.choice(len(by_class), size=2, replace=False)
            ca, cb = sorted(by_class)[int(k)], sorted(by_class)[int(l_)]
            a = by_class[ca][int(rng.integers(len(by_class[ca])))]
            b = by_class[cb][int(rng.integers(len(by_class[cb])))]
        out.append({"img1": a.uuid, "img2": b.uuid, "class_id1": a.class_id, "class_id2": b.class_id,
                    "label": int(a.class_id == b.class_id)})
    return out
