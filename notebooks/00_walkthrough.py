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
# # Image Difference Captioning: a walkthrough
#
# Given two similar images, say in words what changed. This notebook shows the data the kit reproduces the
# papers on and scores two honest baselines with the same evaluator every model uses.
#
# **Data.** Unless `clevr_root` points at the real CLEVR-Change, this runs on *SynthCLEVR-Change*: synthetic
# scenes rendered by the kit's own ray caster and written in the exact on-disk format of CLEVR-Change (same
# folders, file names, JSON schemas, change types and caption grammar). Numbers on it are **synthetic-data
# numbers**: they show that the pipeline works and how methods rank, not what the papers measured.

# %% tags=["parameters"]
profile = "cpu"        # smoke | cpu | paper
clevr_root = None       # None: the synthetic default of the profile; else a real CLEVR-Change root
runs_dir = None        # unused here (no training); kept so every notebook takes the same parameters
report_dir = None      # None: reports/ in the repo (reports/<profile>/ for smoke and paper)
seeds = [0]
device = None          # None: auto (cuda > mps > cpu); or "cpu", "cuda:1"
n_show = 4

# %%
from idckit import paths
from idckit.experiments import walkthrough
from idckit.plots import change_type_counts, show_pairs
from idckit.report import labelled, report_summary, write_report

report_dir = report_dir or paths.reports_dir(profile)
result = walkthrough.run(profile, clevr_root, device=device)
print(result.data.description)

# %% [markdown]
# ## The pairs
# Each *before* image has two *after* images: one with a semantic change (colour, material, add, drop or move)
# and one with only a viewpoint/lighting change, the **distractor**, whose references say "no change".

# %%
test = result.dataset.pairs("test")
fig = show_pairs(test, n=n_show)

# %% [markdown]
# ## How many pairs of each kind

# %%
fig = change_type_counts(result.counts)
import pandas as pd
labelled(pd.DataFrame(result.counts), "Pairs per change type (rows) and split (columns)", precision=0)

# %% [markdown]
# ## Two baselines, scored per change type
# *Most frequent caption* sees no image; *nearest pixel difference* copies the caption of the training pair
# whose pixel difference looks most alike. CIDEr-D (x100) per subset, each subset scored as its own corpus
# (RCC's protocol). Any model worth its name must clear these.

# %%
labelled(result.table("CIDEr-D"), "CIDEr-D (x100) on test: baselines (rows) by subset (columns)")

# %%
labelled(result.table("Bleu_4"), "BLEU-4 (x100) on test: baselines (rows) by subset (columns)")

# %% [markdown]
# What the two baselines say for a few test pairs:

# %%
fig = show_pairs(test, n=n_show, captions=result.predictions)

# %%
path = write_report(report_dir, "00_walkthrough", "walkthrough", result.rows(),
                    walkthrough.provenance(result, profile), title="Walkthrough: data and baselines",
                    headline=result.headline(),
                    notes=["Baselines only; no model is trained in this notebook.",
                           "Synthetic-data numbers are not comparable with the papers' real-data numbers."])
report_summary(path)
