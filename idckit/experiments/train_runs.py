"""Train the runs behind the notebooks without the notebooks: ``idckit train pcl|clip4idc``.

This is the entry point for many GPUs: ``torchrun --nproc_per_node=8 -m idckit.cli train pcl --profile paper
--data-root DATA`` trains every IDC-PCL run of tables 2-4 with DistributedDataParallel, into the same run cache the
notebooks read. Run keys do not depend on the device or on the number of processes (N processes train on the same
global batches as one, see :mod:`idckit.train.distributed`), so ``idckit reproduce`` afterwards finds every run
finished and only renders the reports.

Under torchrun rank 0 prepares what is written to disk (a generated dataset, features, image caches) before the
other ranks read it; every rank then trains its share, and rank 0 writes the runs' files.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from idckit.errors import ConfigError
from idckit.experiments import recipes
from idckit.paths import DEFAULT_PROFILE
from idckit.train import distributed

KINDS = ("pcl", "clip4idc")


def train(kind: str, profile: str = DEFAULT_PROFILE, data_root: str | Path | None = None, *,
          variants: Sequence[str] | None = None, seeds: Sequence[int] = (0,), runs_dir: str | Path | None = None,
          device: str | None = None, progress: bool = True) -> list[dict[str, Any]]:
    """Every requested variant x seed of ``kind`` (default: every ``<kind>/*`` recipe of
    :mod:`idckit.experiments.recipes`), each trained once."""
    from idckit.device import resolve

    if kind not in KINDS:
        raise ConfigError(f"unknown kind of run {kind!r}; known: {', '.join(KINDS)}")
    if kind == "pcl":
        from idckit.experiments import pcl as experiments
    else:
        from idckit.experiments import clip4idc as experiments
    from idckit.experiments.config import check_seeds

    # before any process starts, and before the data and features are prepared
    variants = recipes.check_variants(list(variants) if variants else None, kind)
    seeds = check_seeds(list(seeds))
    distributed.init(resolve(device))
    progress = progress and distributed.is_main()
    s = distributed.main_first(lambda: experiments.setup(profile, data_root, runs_dir=runs_dir, progress=progress,
                                                         device=device))
    return experiments.runs(s, variants, seeds, progress=progress)
