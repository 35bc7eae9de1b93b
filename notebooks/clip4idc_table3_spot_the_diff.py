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
# # CLIP4IDC, Table 3: Spot-the-Diff
#
# CLIP4IDC (the split pair encoder adapted by pair <-> text retrieval, then a transformer captioner) and CLIP-FT
# (plain CLIP per image, no adaptation) on Spot-the-Diff, selected on **val** CIDEr-D, decoded greedily and scored on
# test with pycocoevalcap.
#
# **Single-sentence protocol** (as the Spot-the-Diff loader defines it, `idckit.data.spot_the_diff`): one sentence
# is generated per pair and scored against the pooled sentences of every annotator of that pair. Training samples
# one of those sentences per pair. About 30 % of the references say there is no difference, so a text-only
# baseline is shown: the most frequent training sentence written for every test pair.
#
# Unless `spot_root` points at the real release's `data/` folder this runs on **SynthSpot-the-Diff** (a fixed
# street camera, 1-3 object changes or only light and noise), and at the `smoke` and `cpu` profiles the CLIP is the
# **idckit stand-in CLIP (synthetic pre-training)**, pre-trained here on the set's single-image descriptions.

# %% tags=["parameters"]
profile = "cpu"        # smoke | cpu | paper
spot_root = None       # None: the synthetic default of the profile; else a real Spot-the-Diff data/ folder
runs_dir = None        # None: runs/ in the repo (runs are cached by config hash; shared with Tables 5 and 6)
report_dir = None      # None: reports/ in the repo (reports/<profile>/ for smoke and paper)
seeds = [0]            # captioning seeds (one adaptation run, seed 0)
device = None          # None: auto (cuda > mps > cpu); or "cpu", "cuda:1"
clip_model = None      # None: the profile's CLIP (the stand-in at smoke and cpu); e.g. ViT-B-32
pretrained = None      # None: the profile's weights (the stand-in is pre-trained here); e.g. openai or a file

# %%
from idckit.reports.notebook_params import check_parameters

check_parameters(globals())  # a misspelt `papermill -p NAME VALUE` fails here, in seconds

# %%
from idckit import paths
from idckit.experiments import clip4idc
from idckit.experiments import pair_table
from idckit.experiments.analytics import captions_by_run, collapse_check
from idckit.reports.plots import show_pairs
from idckit.reports.report import paper_table, paper_value, report_summary
from idckit.reports.format import legend

report_dir = report_dir or paths.reports_dir(profile)
setup = clip4idc.setup(profile, spot_root, runs_dir=runs_dir, clip_model=clip_model, pretrained=pretrained,
                       device=device, dataset="spot-the-diff")
results = clip4idc.runs(setup, ["clip-ft", "clip4idc"], seeds)
paper_cider = {r["model"]: r["metrics"]["CIDEr-D"] for r in paper_table("clip4idc.table3")["rows"]}
# the paper's CLIP-FT on Spot-the-Diff is a row of its Table 5
paper_cider["CLIP-FT"] = paper_value("clip4idc.table5", "CIDEr-D", dataset="spot-the-diff",
                                          variant="CLIP-FT")
table = pair_table.build(setup, results, "clip4idc.table3", paper_cider)   # with the text-only baseline row

# %% [markdown]
# ## The paper's table, the kit's runs and the text-only baseline (x100)
# The baseline writes the most frequent training sentence for every test pair: it sees no image.

# %%
table.comparison()

# %%
fig = table.bars()

# %% [markdown]
# ## The ordering against the paper and the baseline, read against the noise
# One seed: the noise is a 95 % bootstrap interval over the test pairs; a smaller gap is "within noise".

# %%
table.ordering()

# %% [markdown]
# ## Does the model look at the images?
# Distinct test captions per run: a run that writes one sentence for every pair is scored on that sentence alone,
# as the text-only baseline is.

# %%
diversity, collapse_notes = collapse_check(setup.runs_dir, results)
diversity

# %% [markdown]
# ## A few test pairs: the references and what each run wrote
# Every reference of every annotator is a reference of the pair; a caption equal to one of them is marked.

# %%
fig = show_pairs(setup.data.dataset().pairs("test"), captions=captions_by_run(setup.runs_dir, results),
                 references=4)

# %%
path = table.write(report_dir, "clip4idc_table3_spot_the_diff", "CLIP4IDC CIDEr-D, test (single-sentence protocol)",
                   paper_value("clip4idc.table3", "CIDEr-D", model="CLIP4IDC"),
                   extra_notes=["Single-sentence protocol: one generated sentence per pair, every annotator's "
                                "sentences as references."],
                   collapse_notes=collapse_notes)
legend(["CIDEr-D", "distinct captions", "no-learning baseline", "within noise", "–"])

# %%
report_summary(path)
