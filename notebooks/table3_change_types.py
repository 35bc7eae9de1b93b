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
# # IDC-PCL, Table 3: CIDEr-D by change type on CLEVR-Change
#
# The same run as Table 2 (trained once, read from the run cache), broken down RCC's way: each change type and
# the distractors scored as their own corpus. Synthetic-data numbers unless `clevr_root` is the real dataset.

# %% tags=["parameters"]
profile = "cpu"        # smoke | cpu | paper
clevr_root = None       # None: the synthetic default of the profile; else a real CLEVR-Change root
runs_dir = None        # None: runs/ in the repo (shared with table 2 and table 4)
report_dir = None      # None: reports/ in the repo (reports/<profile>/ for smoke and paper)
seeds = [0]
device = None          # None: auto (cuda > mps > cpu); or "cpu", "cuda:1"
backbone = None        # None: the profile default (efficientnet_lite0)
released_checkpoint = None  # None: no row; else the authors' IDC-PCL checkpoint (their file, or an imported run)

# %%
from idckit.reports.notebook_params import check_parameters

check_parameters(globals())  # a misspelt `papermill -p NAME VALUE` fails here, in seconds

# %%
import time

from idckit import paths
from idckit.authors import released
from idckit.data.clevr_change import CHANGE_TYPES
from idckit.experiments import pcl
from idckit.experiments import duda  # the baseline rows (the first import names the notebook's paper for idckit doctor)
from idckit.experiments import reporting, yardsticks
from idckit.experiments.analytics import captions_by_run
from idckit.reports.plots import per_type_bars, show_pairs
from idckit.reports.report import paper_table, report_summary, write_report
from idckit.reports.format import Notes, comparison, legend

t0 = time.time()
report_dir = report_dir or paths.reports_dir(profile)
setup = pcl.setup(profile, clevr_root, runs_dir=runs_dir, backbone=backbone, device=device)
results = pcl.runs(setup, ["full"], seeds)
hard, hard_results = pcl.hard_runs(setup, ["full"], seeds)   # the faithful jitter (synthetic data only)
# DUDA, the field's explicit-difference baseline, on the same data and features (cached: table 2 trained it)
duda_setup = duda.setup(profile, clevr_root, runs_dir=runs_dir, backbone=backbone, device=device)
duda_results = duda.runs(duda_setup, ["duda"], seeds)
_, duda_hard = duda.hard_runs(duda_setup, ["duda"], seeds)
# the no-learning baselines per change type (cached: table 2 computed them on the same data)
base = yardsticks.clevr_baselines(setup.data, setup.runs_dir)
dataset = yardsticks.dataset_title(setup.data)
FULL = "MLM + MVCL + FDA (full)"

# %% [markdown]
# ## CIDEr-D (x100) per change type: the paper's rows, the kit's runs and the no-learning baselines

# %%
rows = yardsticks.type_rows(setup, results + duda_results)
hard_rows = reporting.per_type_rows(hard_results + duda_hard)
base_rows = yardsticks.baseline_type_rows(base)
released_rows = released.pcl_rows(setup, released_checkpoint, per_type=True)  # the authors' weights: a side row
paper = paper_table("pcl.table3")
comparison(rows + hard_rows + base_rows + released_rows, paper["rows"], metrics=reporting.TYPES,
           caption=f"Table 3: CIDEr-D per change type, the paper (real CLEVR-Change) and the kit ({dataset}), test")

# %%
bars = [{"model": f"{r['model']} {r['variant']}" if r["model"] == reporting.BASELINE_MODEL else r["model"],
         "type": t, "CIDEr-D": v} for r in rows + base_rows if r.get("seed") in (seeds[0], None)
        for t, v in r["metrics"].items()]
fig = per_type_bars(bars, title=f"Table 3, {dataset}: test CIDEr-D per change type (seed {seeds[0]})")

# %% [markdown]
# ## Does the caption name the change type? (per type, beside guessing the most common type)

# %%
yardsticks.type_describe_table(rows + base_rows, caption=f"Change type named, % of the changed test pairs ({dataset})")

# %% [markdown]
# ## A few test pairs: the references and what each run wrote (and the judge oracle)

# %%
shown = {**captions_by_run(setup.runs_dir, results + duda_results), "judge oracle": base[2]["predictions"]}
fig = show_pairs(setup.data.dataset().pairs("test"), captions=shown)

# %%
paper_types = next(r for r in paper["rows"] if r["model"] == "IDC-PCL")["metrics"]
semantic = [t for t in CHANGE_TYPES if all(t in r["metrics"] for r in rows)]  # tiny test splits lack some
notes = yardsticks.hardest_type_notes(rows, paper_types, FULL, semantic) + yardsticks.type_standing_notes(
    rows + base_rows, FULL, semantic)
if hard:
    notes.append(f"Rows marked [hard data] ran on {hard.data.description}: CLEVR-Change's own jitter, kept "
                 "beside the learnable default so the table shows what the difficulty changes.")
path = write_report(
    report_dir, "table3_change_types", "pcl.table3", rows + hard_rows + base_rows + released_rows,
    pcl.provenance(setup, results, seeds, time.time() - t0),
    headline=yardsticks.type_headline(rows + base_rows, FULL, "IDC-PCL CIDEr-D, mean of the five change types",
                                      paper_types, semantic),
    notes=notes)
Notes(notes)

# %%
legend()

# %%
report_summary(path)
