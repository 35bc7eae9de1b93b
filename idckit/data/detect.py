"""Which pair dataset a folder holds, told from its layout, so commands that take a root work on all of them."""
from __future__ import annotations

from pathlib import Path

from idckit.errors import DatasetError

LAYOUTS = (
    ("clevr-change", ("images", "sc_images", "nsc_images")),
    ("spot-the-diff", ("annotations", "resized_images")),
    ("editing-request", ("train.json", "valid.json", "test.json")),
)


def dataset_name(root: str | Path) -> str:
    """``clevr-change``, ``spot-the-diff`` or ``editing-request``: the first layout whose marker entries exist
    (all of CLEVR-Change's or Spot-the-Diff's folders, any of IER's three split files)."""
    root = Path(root)
    for name, entries in LAYOUTS:
        present = [(root / e).exists() for e in entries]
        if all(present) if name != "editing-request" else any(present):
            return name
    raise DatasetError("not a dataset root: no CLEVR-Change, Spot-the-Diff or Image-Editing-Request layout here",
                       path=root, fix="pass the folder holding images/ + sc_images/ + nsc_images/ (CLEVR-Change), "
                                      "annotations/ + resized_images/ (Spot-the-Diff, the release's data/), or "
                                      "train.json / valid.json / test.json (IER)")


def open_dataset(root: str | Path):
    """The loader of ``root`` (``ClevrChange``, ``SpotTheDiff`` or ``EditingRequest``), validated."""
    name = dataset_name(root)
    if name == "clevr-change":
        from idckit.data.clevr_change import ClevrChange
        return ClevrChange(root)
    if name == "spot-the-diff":
        from idckit.data.spot_the_diff import SpotTheDiff
        return SpotTheDiff(root)
    from idckit.data.editing_request import EditingRequest
    return EditingRequest(root)
