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
# Given two similar images, say in words what changed. This notebook shows the pipeline the two reproduced papers
# build, the data they are scored on, what the score (CIDEr-D) rewards, the no-learning baselines every model must
# beat, and how to read the card and the status at the top of every report.
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
from idckit.reports.notebook_params import check_parameters

check_parameters(globals())  # a misspelt `papermill -p NAME VALUE` fails here, in seconds

# %%
from idckit import paths
from idckit.experiments import walkthrough
from idckit.reports.plots import change_type_counts, show_pairs
from idckit.reports.report import read_report, report_summary, write_report
from idckit.reports.card import Card
from idckit.reports.format import legend

report_dir = report_dir or paths.reports_dir(profile)
result = walkthrough.run(profile, clevr_root, device=device)

# %% [markdown]
# ## The two pipelines
# Both turn a pair of images into a sentence. **IDC-PCL** reads grid features of each image and lets an image
# difference encoder compare them before a cross-modal transformer writes the caption; it is *pre-trained* on the
# pairs first (masked words, matching views, telling a true caption from a hard negative), which teaches it which
# words go with which differences before it learns to write. **CLIP4IDC** starts from CLIP's image encoder: the
# first layers see each image alone, the last layers see both images' tokens together; *adaptation* trains this
# encoder to retrieve a pair's caption among all captions before a captioner is trained on top of it.

# %%
fig = walkthrough.pipeline_figure()

# %% [markdown]
# ## The pairs
# Each *before* image has two *after* images: one with a semantic change (colour, material, add, drop or move)
# and one **distractor**, the same scene with no object changed, whose references say "no change". What a
# distractor is on this data, measured:

# %%
walkthrough.distractor_note(result)

# %%
test = result.dataset.pairs("test")
fig = show_pairs(test, n=n_show)

# %% [markdown]
# ## How many pairs of each kind

# %%
fig = change_type_counts(result.counts)
result.counts_table()

# %% [markdown]
# ## What CIDEr-D rewards, and the no-learning baselines
# *Most frequent caption* sees no image; *nearest pixel difference* copies the caption of the training pair whose
# pixel difference looks most alike (a pixel-identical pair gets the no-change caption); the *judge oracle* is told
# whether the pair changed and writes the most frequent caption of that kind. CIDEr-D (x100) per subset, each subset
# scored as its own corpus (RCC's protocol). Any model worth its name must clear the first two.

# %%
result.table("CIDEr-D")

# %%
walkthrough.cider_story(result)

# %% [markdown]
# ## Does a caption describe the change?
# How often each baseline's caption names the right change type and the changed object (read against each scene's
# change record), beside chance. Every CLEVR report shows the same numbers for its models.

# %%
result.describes_table()

# %% [markdown]
# What the baselines say for a few test pairs:

# %%
fig = show_pairs(test, n=n_show, captions=result.predictions)

# %% [markdown]
# ## How to read a report
# Every report opens with a card: the headline number, the no-learning baseline on the same test pairs and the
# paper's number side by side; the **status** of the headline run (only that run: never a baseline or a side row);
# a one-sentence verdict; for CLEVR, how often the captions name the change. Orderings are stated only when a gap
# is larger than the noise measured for it (seed spread, or a bootstrap interval over test pairs), else "within
# noise". The status words:

# %%
walkthrough.status_legend()

# %%
path = write_report(report_dir, "00_walkthrough", "walkthrough", result.rows(),
                    walkthrough.provenance(result, profile),
                    title="Walkthrough: the pipelines, the data, the baselines",
                    headline=result.headline(),
                    notes=["Baselines only; no model is trained in this notebook."])

# %% [markdown]
# This notebook's own card (a report of baselines alone):

# %%
Card(read_report(path))

# %% [markdown]
# ## Where to go next
# - [the index of reports](index.html): every table, its status and its baseline, grouped by paper;
# - IDC-PCL: [table 2](table2_clevr_change.html) (CLEVR-Change), [table 4](table4_ablation.html) (what each
#   pre-training task adds); CLIP4IDC: [table 1](clip4idc_table1_clevr_change.html),
#   [table 6](clip4idc_table6_retrieval.html) (what adaptation adds to retrieval);
# - the docs: `docs/idcpcl.md`, `docs/clip4idc.md`, `docs/real_data.md` (running on the real datasets).

# %%
legend(["CIDEr-D", "total / semantic / distractor", "no-learning baseline", "within noise", "–"])

# %%
report_summary(path)
