"""Diagnostic, not a kit variant: does IDC-PCL describe changes once it is handed the subtraction DUDA makes?

IDC-PCL must find a change by attention: its words attend to the regions of both images and the pair encoder
compares them (docs/learnability.md, "Where the words look"). DUDA subtracts the attended features of the two
images, and on the same data it writes far better change captions ("The object count"). This script trains the
cpu profile's IDC-PCL (``scripts/learnability.py run``, same arguments) with n more visual tokens appended after the
image difference encoder: the embedding LayerNorm of a new linear map of ``f2 - f1`` (the raw grid features of
region j, after minus before) plus region j's position and a learned type vector, the explicit difference that
CLIP4IDC's labelled ``captioner.difference_tokens`` gives its captioner. Pre-training and fine-tuning both see them;
the judge, MVCL and decoding read the same positions as before (the new tokens come last).

The change is a patch of :class:`idckit.models.pcl.PCL` in this process only, so the run keys cannot see it: pass a
``--runs-dir`` of its own (features and FDA negatives can be links to another runs dir's, they do not depend on the
model). Not the paper's architecture and not in any config or report table.

    .venv/bin/python scripts/pcl_difference_tokens.py --data-root DATA --steps 500 --eval-every 250 \
        --threads 1 --seed 0 --runs-dir RUNS_DIFF --tag _difftokens
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from idckit.models import pcl as model  # noqa: E402

_init, _encode_images = model.PCL.__init__, model.PCL.encode_images


def __init__(self, cfg, vocab):
    _init(self, cfg, vocab)
    self.diff_project = nn.Linear(cfg.feat_dim, cfg.d_model)
    self.diff_type = nn.Parameter(torch.zeros(cfg.d_model))
    self._init(self.diff_project)          # N(0, 0.02), zero bias, as every other projection


def encode_images(self, f1, f2, region_mask=None):
    single, pair = _encode_images(self, f1, f2, region_mask)
    if region_mask is not None:            # MVCL: the masked regions' raw features are zero here too
        f1 = f1.masked_fill(region_mask[:, 0, :, None], 0.0)
        f2 = f2.masked_fill(region_mask[:, 1, :, None], 0.0)
    diff = self.diff_project(f2 - f1) + self.diff_type + self.pe[:f1.shape[1]]
    return single, torch.cat([pair, self.emb_drop(self.emb_ln(diff))], 1)


model.PCL.__init__, model.PCL.encode_images = __init__, encode_images

if __name__ == "__main__":
    import learnability

    argv = sys.argv[1:]
    if "--runs-dir" not in argv and not {"-h", "--help"} & set(argv):
        sys.exit("pass a --runs-dir of its own: run keys cannot see this patch")
    sys.exit(learnability.main(["run", *argv]))
