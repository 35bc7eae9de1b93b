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
# # CLIP4IDC, Table 5: ablation (CLEVR-Change and Spot-the-Diff columns)
#
# Three captioners on the same CLIP: **CLIP-FT** (each image through the whole plain ViT, the two token sequences
# concatenated; no intra/inter split, no adaptation), **CLIP4IDC without adaptation** (the split pair encoder, its
# new e1/e2/p/ln_mid untrained) and **CLIP4IDC** (the split encoder after retrieval adaptation; shared with Tables 1,
# 2 and 7). Unless `clevr_root` is real this is SynthCLEVR-Change, and at `smoke`/`cpu` the CLIP is the **idckit
# stand-in CLIP (synthetic pre-training)**. At `cpu` every pair encoder is frozen during captioning (the paper trains
# it at lr 1e-7), so the rows compare the encoders' representations.
#
# The Spot-the-Diff column runs the same three captioners on SynthSpot-the-Diff (unless `spot_root` is the real
# release's `data/` folder), under the single-sentence protocol of Table 3 (its CLIP4IDC and CLIP-FT runs are
# Table 3's, read from the run cache).
#
# The kit's CLIP-FT adds a 2-row before/after segment embedding to the caption encoder (without it the model could
# not tell "added" from "dropped"; see `idckit/models/clip4idc.py`).

# %% tags=["parameters"]
profile = "cpu"        # smoke | cpu | paper
clevr_root = None       # None: the synthetic default of the profile; else a real CLEVR-Change root
runs_dir = None        # None: runs/ in the repo (the CLIP4IDC row is shared with Tables 1 and 2)
report_dir = None      # None: reports/ in the repo (reports/<profile>/ for smoke and paper)
seeds = [0]
device = None          # None: auto (cuda > mps > cpu); or "cpu", "cuda:1"
clip_model = None      # None: the profile's CLIP (the stand-in at smoke and cpu); e.g. ViT-B-32
pretrained = None      # None: the profile's weights; e.g. openai or a checkpoint file
spot_root = None       # None: SynthSpot-the-Diff of the profile; else a real Spot-the-Diff data/ folder

# %%
from idckit.reports.notebook_params import check_parameters

check_parameters(globals())  # a misspelt `papermill -p NAME VALUE` fails here, in seconds

# %%
import time

from idckit import paths
from idckit.experiments import clip4idc
from idckit.experiments import reporting, yardsticks
from idckit.experiments.analytics import captions_by_run, collapse_check
from idckit.reports.plots import show_pairs, side_by_side_bars
from idckit.reports.report import paper_rows, report_summary, write_report
from idckit.reports.format import Notes, comparison, legend
from idckit.reports.stats import ordering_notes

t0 = time.time()
report_dir = report_dir or paths.reports_dir(profile)
setup = clip4idc.setup(profile, clevr_root, runs_dir=runs_dir, clip_model=clip_model, pretrained=pretrained,
                       device=device)
results = clip4idc.runs(setup, ["clip-ft", "no-adapt", "clip4idc"], seeds)
base = yardsticks.clevr_baselines(setup.data, setup.runs_dir)   # the no-learning baselines on the same test pairs
dataset = yardsticks.dataset_title(setup.data)
LABELS = {"CLIP-FT": "CLIP-FT", "no adaptation": "CLIP4IDC w/o adaptation", "adaptation": "CLIP4IDC"}

# %% [markdown]
# ## The paper's CLEVR rows, the kit's and the no-learning baselines (x100)

# %%
rows = yardsticks.clevr_rows(setup, results)
base_rows = yardsticks.baseline_rows(base)
paper = paper_rows("clip4idc.table5", dataset="clevr-change")
comparison(rows + base_rows, paper, caption=f"Table 5: the paper (real CLEVR-Change) and the kit ({dataset}), test")

# %%
kit = reporting.per_variant(rows)
paper_cider = {LABELS.get(r["variant"], r["variant"]): r["metrics"]["CIDEr-D"] for r in paper}
fig = side_by_side_bars(kit, paper_cider, list(LABELS.values()), title=f"Table 5: test CIDEr-D ({dataset})",
                        kit_label=f"idckit ({dataset})", paper_label="paper (real CLEVR-Change)")

# %% [markdown]
# ## The ordering against the paper and the baselines, read against the noise

# %%
notes = ordering_notes(rows, paper_cider) + yardsticks.standing_notes(rows + base_rows, "CLIP4IDC")
Notes(notes)

# %% [markdown]
# ## What the captions say about the change

# %%
yardsticks.describe_table(rows + base_rows, caption=f"What the captions say ({dataset}, test)")

# %% [markdown]
# ## The Spot-the-Diff column: the paper's rows and the kit's (x100)

# %%
spot = clip4idc.setup(profile, spot_root, runs_dir=runs_dir, clip_model=clip_model, pretrained=pretrained,
                      device=device, dataset="spot-the-diff")
spot_results = clip4idc.runs(spot, ["clip-ft", "no-adapt", "clip4idc"], seeds)
spot_rows = reporting.rows(spot_results)
yardsticks.add_bootstrap(spot_rows, spot_results, spot.data.dataset().references("test"))
spot_rows = [{**r, "dataset": "spot-the-diff"} for r in spot_rows]
spot_paper = paper_rows("clip4idc.table5", dataset="spot-the-diff")
spot_title = yardsticks.dataset_title(spot.data)
comparison(spot_rows, spot_paper, caption=f"Table 5: the paper (real Spot-the-Diff) and the kit ({spot_title}), test")

# %%
spot_kit = reporting.per_variant(spot_rows)
spot_paper_cider = {LABELS.get(r["variant"], r["variant"]): r["metrics"]["CIDEr-D"] for r in spot_paper}
fig = side_by_side_bars(spot_kit, spot_paper_cider, list(LABELS.values()),
                        title=f"Table 5: test CIDEr-D ({spot_title})",
                        kit_label=f"idckit ({spot_title})", paper_label="paper (real Spot-the-Diff)")
spot_notes = [f"Spot-the-Diff: {n}" for n in ordering_notes(spot_rows, spot_paper_cider)]
Notes(spot_notes)

# %% [markdown]
# ## Does the model look at the images?
# Distinct test captions per run: a run that writes one sentence for every pair is scored on that sentence alone.

# %%
named = results + [{**r, "label": f"{r['label']} (Spot-the-Diff)"} for r in spot_results]
diversity, collapse_notes = collapse_check(setup.runs_dir, named)
diversity

# %% [markdown]
# ## A few test pairs: the references and what each run wrote

# %%
fig = show_pairs(setup.data.dataset().pairs("test"), captions=captions_by_run(setup.runs_dir, results))

# %%
path = write_report(
    report_dir, "clip4idc_table5_ablation", "clip4idc.table5", rows + base_rows + spot_rows,
    clip4idc.provenance(setup, results + spot_results, seeds, time.time() - t0),
    headline={"label": "CLIP4IDC minus CLIP-FT, CIDEr-D", "kit": round(kit["CLIP4IDC"] - kit["CLIP-FT"], 2),
              "paper": round(paper_cider["CLIP4IDC"] - paper_cider["CLIP-FT"], 2), "metric": "CIDEr-D",
              "metric_kind": "difference", "runs": {"variants": ["CLIP4IDC", "CLIP-FT"]}},
    notes=[f"CLIP: {results[0]['clip']}.", *notes,
           f"Spot-the-Diff column: {spot.data.description}; CLIP: {spot_results[0]['clip']}.", *spot_notes,
           *collapse_notes])
legend(["CIDEr-D", "distinct captions", "no-learning baseline", "within noise", "–"])

# %%
report_summary(path)
