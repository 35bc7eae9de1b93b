"""Which pair dataset a folder holds, told from its layout (the markers of :data:`idckit.registry.DATASETS`), so
commands that take a root work on all of them."""
from __future__ import annotations

from pathlib import Path

from idckit import registry
from idckit.errors import DatasetError


def dataset_name(root: str | Path) -> str:
    """The first pair dataset whose layout markers exist under ``root`` (all of them, or any one where the dataset
    says so: IER's three split files), in registry order."""
    root = Path(root)
    for name in registry.pair_datasets():
        d = registry.dataset(name)
        present = [(root / e).exists() for e in d.markers]
        if d.markers and (any(present) if d.any_marker else all(present)):
            return name
    layouts = "; ".join(f"{registry.dataset(n).title}: {registry.dataset(n).layout}" for n in registry.pair_datasets())
    raise DatasetError("not a dataset root: no known pair dataset layout here", path=root,
                       fix=f"pass the folder holding one of these layouts: {layouts}")


def open_dataset(root: str | Path):
    """The loader of ``root`` (``ClevrChange``, ``SpotTheDiff``, ``EditingRequest``, ...), validated."""
    return registry.dataset(dataset_name(root)).load(root)
