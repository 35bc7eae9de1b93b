# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python (idckit)
#     language: python
#     name: idckit
# ---

# %% [markdown]
# # CLIP4IDC, Table 6: retrieval after adaptation (CLEVR-Change, Spot-the-Diff and Image-Editing-Request rows)
#
# Image pair -> text and text -> image pair retrieval on test with the adapted pair encoder (the adaptation run of
# Tables 1, 2, 5: cached and shared), CLIP4IDC's protocol (`idckit.eval.retrieval`: text->pair ranks every change
# pair for each change caption; pair->text ranks caption groups). The checkpoint is chosen on **val** text->pair R@1
# (the public code chose it on test). Two references show what adaptation adds: the same split encoder before
# adaptation (its e1/e2/p/ln_mid fresh) and plain CLIP (the mean of the two images' embeddings).
# Unless `clevr_root` is real this is SynthCLEVR-Change, and at `smoke`/`cpu` the CLIP is the **idckit stand-in CLIP
# (synthetic pre-training)**.
#
# The Spot-the-Diff and Image-Editing-Request rows use the adaptation runs of Tables 3 and 4 (SynthSpot-the-Diff and
# SynthIER unless `spot_root` / `ier_root` are real), at the paper's K: R@10/20/50 on Spot-the-Diff (its sentences
# are short, generic and repeated across pairs, so R@1 is tiny), R@1/5/10 on IER. Each comes with its chance row.

# %% tags=["parameters"]
profile = "cpu"        # smoke | cpu | paper
clevr_root = None       # None: the synthetic default of the profile; else a real CLEVR-Change root
runs_dir = None        # None: runs/ in the repo (shared with the captioning tables)
report_dir = None      # None: reports/ in the repo (reports/<profile>/ for smoke and paper)
seeds = [0]            # adaptation seeds (the captioning tables use seed 0)
device = None          # None: auto (cuda > mps > cpu); or "cpu", "cuda:1"
clip_model = None      # None: the profile's CLIP (the stand-in at smoke and cpu); e.g. ViT-B-32
pretrained = None      # None: the profile's weights; e.g. openai or a checkpoint file
spot_root = None       # None: SynthSpot-the-Diff of the profile; else a real Spot-the-Diff data/ folder
ier_root = None        # None: SynthIER of the profile; else a real Image-Editing-Request root
released_adapt_checkpoint = None  # None: no row; else the authors' CLEVR adaptation checkpoint (file or run)

# %%
from idckit.reports.notebook_params import check_parameters

check_parameters(globals())  # a misspelt `papermill -p NAME VALUE` fails here, in seconds

# %%
import time

from idckit import paths
from idckit.authors import released
from idckit.experiments import clip4idc  # noqa: F401  (names the notebook's paper for idckit doctor)
from idckit.experiments import retrieval_table
from idckit.reports.report import paper_value, report_summary, write_report
from idckit.reports.format import Notes, legend

t0 = time.time()
report_dir = report_dir or paths.reports_dir(profile)
common = dict(runs_dir=runs_dir, clip_model=clip_model, pretrained=pretrained, device=device)
clevr = retrieval_table.build(profile, clevr_root, "clevr-change", seeds, **common)
released.add_retrieval_rows(clevr, released_adapt_checkpoint)  # the authors' weights, scored by the kit: a side row
spot = retrieval_table.build(profile, spot_root, "spot-the-diff", seeds, **common)
ier = retrieval_table.build(profile, ier_root, "editing-request", seeds, **common)

# %% [markdown]
# ## CLEVR-Change: the paper's row, the kit's encoder before and after adaptation, plain CLIP and chance
# Chance is a random ranking of the test pairs (R@K = K / pairs, median rank (pairs + 1) / 2).

# %%
clevr.comparison()

# %%
fig = clevr.bars(seeds[0])

# %% [markdown]
# ## Val retrieval during adaptation (the checkpoint is chosen here)

# %%
clevr.history()

# %% [markdown]
# ## Spot-the-Diff (the paper reports R@10/20/50)

# %%
spot.comparison()

# %%
fig = spot.bars(seeds[0])

# %% [markdown]
# ## Image Editing Request

# %%
ier.comparison()

# %%
fig = ier.bars(seeds[0])

# %% [markdown]
# ## Did adaptation raise retrieval? (gaps read against the noise of R@1 on this many test pairs)

# %%
verdicts = [t.verdict() for t in (clevr, spot, ier)]
Notes(verdicts)

# %%
head_variant = clevr.rows[0]["variant"]
path = write_report(
    report_dir, "clip4idc_table6_retrieval", "clip4idc.table6", clevr.rows + spot.rows + ier.rows,
    clip4idc.provenance(clevr.setup, clevr.adapted + spot.adapted + ier.adapted, seeds, time.time() - t0,
                        selection="val (text->pair R@1)"),
    headline={"label": "CLIP4IDC text->pair R@1, test", "kit": round(clevr.adapted[0]["test"]["t2p_R@1"], 2),
              "paper": paper_value("clip4idc.table6", "t2p_R@1", model="CLIP4IDC", dataset="clevr-change"),
              "metric": "t2p_R@1", "runs": {"variants": [head_variant]}},
    notes=[f"CLIP: {clevr.adapted[0]['clip']}.", *verdicts,
           f"Chance text->pair R@1 on these {clevr.n_pairs} test pairs: {clevr.rows[-1]['metrics']['t2p_R@1']:.2f} %.",
           "Templated captions cap R@1: several pairs share one caption (ties count against the query)."])
legend(["R@K", "median / mean rank", "within noise", "–"])

# %%
report_summary(path)
