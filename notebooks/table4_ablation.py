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
# # IDC-PCL, Table 4: ablation on CLEVR-Change
#
# Six rows: no pre-training; MLM; MLM + MVCL; the full model (MLM + MVCL + FDA); the full model without the
# image difference encoder; the full model without distractor judging. Runs are shared: the full row is Table
# 2's run, and the last row reuses the full row's pre-training. Synthetic-data numbers unless `clevr_root` is
# the real dataset; the paper's rows stand beside them.

# %% tags=["parameters"]
profile = "cpu"        # smoke | cpu | paper
clevr_root = None       # None: the synthetic default of the profile; else a real CLEVR-Change root
runs_dir = None        # None: runs/ in the repo (shared with tables 2 and 3)
report_dir = None      # None: reports/ in the repo (reports/<profile>/ for smoke and paper)
seeds = [0]
device = None          # None: auto (cuda > mps > cpu); or "cpu", "cuda:1"
backbone = None        # None: the profile default (efficientnet_lite0)

# %%
import time

import pandas as pd

from idckit import paths
from idckit.experiments import pcl
from idckit.eval.probe import difference_probe
from idckit.experiments import recipes, reporting
from idckit.experiments.runs import captions_by_run, collapse_check
from idckit.plots import show_pairs, side_by_side_bars
from idckit.report import paper_table, paper_value, report_summary, side_by_side, write_report

t0 = time.time()
report_dir = report_dir or paths.reports_dir(profile)
setup = pcl.setup(profile, clevr_root, runs_dir=runs_dir, backbone=backbone, device=device)
results = pcl.runs(setup, recipes.variants("pcl"), seeds)   # every pcl/* recipe: `idckit list pcl/*`

# %% [markdown]
# ## The ladder: the paper's rows, then the kit's (x100)

# %%
rows = reporting.rows(results)
paper = paper_table("pcl.table4")
side_by_side(rows, paper["rows"]).round(1)

# %%
order = [recipes.get_recipe(v, "pcl").label for v in recipes.variants("pcl")]
kit = pd.DataFrame([{"row": r["variant"], "CIDEr-D": r["metrics"]["CIDEr-D"]} for r in rows if r["seed"] != "mean"])
kit_mean = kit.groupby("row")["CIDEr-D"].mean().to_dict()
paper_by = dict(zip(order, [p["metrics"]["CIDEr-D"] for p in paper["rows"]]))
fig = side_by_side_bars(kit_mean, paper_by, order)

# %% [markdown]
# ## Does the kit's ladder have the paper's shape?
# Each pair of rows the paper orders is checked against the kit's run; sentences marked DIFFERS are where the
# synthetic data (or the cpu budget) does not show the paper's effect.

# %%
key_pairs = [(order[3], order[0]), (order[3], order[4]), (order[3], order[5]), (order[2], order[1]), (order[1], order[0])]
notes = [n for a, b in key_pairs for n in reporting.ordering_notes({a: kit_mean[a], b: kit_mean[b]},
                                                             {a: paper_by[a], b: paper_by[b]})]
for n in notes:
    print(n)

# %% [markdown]
# ## How hard are the features themselves?
# A linear probe on per-region feature distances tells real changes from distractors this well (chance is 50 %).
# Distractor judging, and with it every row's distractor captions, cannot beat the features by much at this budget.

# %%
probe = difference_probe(pcl.loaded_data(setup))
print(f"change vs distractor from feature distances: {100 * probe['test_accuracy']:.1f} % on test (chance {100 * probe['chance']:.0f} %)")
print("judge accuracy of the trained rows:", {r["label"]: r["judge_accuracy"] for r in results if r["judge_accuracy"] is not None})
notes.append(f"A linear probe on per-region feature distances separates changes from distractors at "
             f"{100 * probe['test_accuracy']:.1f} % on test (chance {100 * probe['chance']:.0f} %).")

# %% [markdown]
# ## Does the model look at the images?
# Distinct test captions per run. A run that writes one sentence for every pair is scored on that sentence alone
# (a "no change" sentence alone earns a high CIDEr-D on the distractor half), so read its numbers with this table.

# %%
diversity, collapse_notes = collapse_check(setup.runs_dir, results)
if collapse_notes:
    collapse_notes.insert(0, f"{len(collapse_notes)} of {len(diversity)} rows are COLLAPSED (below): an 'agrees', "
                             "'TIES' or 'DIFFERS' above that involves one of them says which sentence a run settled on, not "
                             "whether the method works.")
    print(collapse_notes[0])
pd.DataFrame(diversity)

# %% [markdown]
# ## A few test pairs: the references and what each run wrote
# Pairs spread over the change types, distractors included; a caption equal to a reference is marked.

# %%
fig = show_pairs(setup.data.dataset().pairs("test"), captions=captions_by_run(setup.runs_dir, results))

# %%
full = next(r for r in rows if r["variant"] == order[3] and r["seed"] != "mean")
path = write_report(
    report_dir, "table4_ablation", "pcl.table4", rows,
    pcl.provenance(setup, results, seeds, time.time() - t0),
    headline={"label": "full model CIDEr-D, test total", "kit": round(full["metrics"]["CIDEr-D"], 2),
              "paper": paper_value("pcl.table4", "CIDEr-D", model="IDC-PCL", variant="MLM+MVCL+FDA")},
    notes=notes + collapse_notes + ["Synthetic-data numbers are not comparable with the paper's real-data numbers."])
report_summary(path)
