"""Diagnostic, not a kit variant: does IDC-PCL describe changes once it is handed the subtraction DUDA makes?

IDC-PCL must find a change by attention: its words attend to the regions of both images and the pair encoder
compares them (lab/notes/learnability.md, "Where the words look"). DUDA subtracts the attended features of the two
images, and on the same data it writes far better change captions ("The object count"). This script trains the
cpu profile's IDC-PCL (``lab.scripts.learnability run``, same arguments) with n more visual tokens appended after the
image difference encoder: the embedding LayerNorm of a new linear map of ``f2 - f1`` (the raw grid features of
region j, after minus before) plus region j's position and a learned type vector, the explicit difference that
CLIP4IDC's labelled ``captioner.difference_tokens`` gives its captioner. Pre-training and fine-tuning both see them;
the judge, MVCL and decoding read the same positions as before (the new tokens come last).

The change is a patch of :class:`idckit.models.pcl.PCL`, applied only inside :func:`patched` (which ``main`` enters
for the whole run, in its own process) and undone on leaving it; importing this module changes nothing. The run
keys cannot see the patch, so pass a ``--runs-dir`` of its own (features and FDA negatives can be links to another runs dir's, they do not depend on the
model). Not the paper's architecture and not in any config or report table.

    .venv/bin/python -m lab.scripts.pcl_difference_tokens --data-root DATA --steps 500 --eval-every 250 \
        --threads 1 --seed 0 --runs-dir RUNS_DIFF --tag _difftokens
"""
from __future__ import annotations

import sys
from contextlib import contextmanager

import torch
import torch.nn as nn

from idckit.models import pcl as model


def _patched_methods(init, encode_images):
    def __init__(self, cfg, vocab):
        init(self, cfg, vocab)
        self.diff_project = nn.Linear(cfg.feat_dim, cfg.d_model)
        self.diff_type = nn.Parameter(torch.zeros(cfg.d_model))
        self._init(self.diff_project)          # N(0, 0.02), zero bias, as every other projection

    def encode_images_with_difference(self, f1, f2, region_mask=None):
        single, pair = encode_images(self, f1, f2, region_mask)
        if region_mask is not None:            # MVCL: the masked regions' raw features are zero here too
            f1 = f1.masked_fill(region_mask[:, 0, :, None], 0.0)
            f2 = f2.masked_fill(region_mask[:, 1, :, None], 0.0)
        diff = self.diff_project(f2 - f1) + self.diff_type + self.pe[:f1.shape[1]]
        return single, torch.cat([pair, self.emb_drop(self.emb_ln(diff))], 1)

    return __init__, encode_images_with_difference


@contextmanager
def patched():
    """PCL with the n after - before tokens while inside; the unpatched class again on leaving, even on error."""
    init, encode_images = model.PCL.__init__, model.PCL.encode_images
    model.PCL.__init__, model.PCL.encode_images = _patched_methods(init, encode_images)
    try:
        yield model.PCL
    finally:
        model.PCL.__init__, model.PCL.encode_images = init, encode_images


def main(argv=None) -> int:
    from lab.scripts import learnability

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--runs-dir" not in argv and not {"-h", "--help"} & set(argv):
        sys.exit("pass a --runs-dir of its own: run keys cannot see this patch")
    with patched():
        return learnability.main(["run", *argv])


if __name__ == "__main__":
    sys.exit(main())
