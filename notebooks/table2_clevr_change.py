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
# # IDC-PCL, Table 2: CLEVR-Change
#
# The full IDC-PCL model (image difference encoder + cross-modal transformer, pre-trained with MLM, MVCL and
# FDA on hard negatives the kit builds itself, then fine-tuned to caption with the uni-directional mask and the
# distractor-judging head), selected on val CIDEr-D, scored on test with pycocoevalcap (PTB tokenisation).
#
# Unless `clevr_root` points at the real CLEVR-Change this runs on **SynthCLEVR-Change** with **ImageNet
# EfficientNet-Lite0** grid features in place of ResNet-101, and at the `cpu` profile a smaller model trained for
# minutes instead of days. The paper's numbers are shown beside the kit's, never mixed with them.

# %% tags=["parameters"]
profile = "cpu"        # smoke | cpu | paper
clevr_root = None       # None: the synthetic default of the profile; else a real CLEVR-Change root
runs_dir = None        # None: runs/ in the repo (runs are cached by config hash and shared between tables)
report_dir = None      # None: reports/ in the repo (reports/<profile>/ for smoke and paper)
seeds = [0]
device = None          # None: auto (cuda > mps > cpu); or "cpu", "cuda:1"
backbone = None        # None: the profile default (efficientnet_lite0); resnet101 or clip:MODEL
released_checkpoint = None  # None: no row; else the authors' IDC-PCL checkpoint (their file, or an imported run)

# %%
from idckit.reports.notebook_params import check_parameters

check_parameters(globals())  # a misspelt `papermill -p NAME VALUE` fails here, in seconds

# %%
import time

from idckit import paths
from idckit.authors import released
from idckit.experiments import pcl
from idckit.experiments import duda  # the baseline rows (the first import names the notebook's paper for idckit doctor)
from idckit.experiments import reporting, yardsticks
from idckit.experiments.analytics import captions_by_run, collapse_check
from idckit.reports.plots import show_pairs, val_curve
from idckit.reports.report import paper_table, paper_value, report_summary, write_report
from idckit.reports.format import Notes, comparison, legend

t0 = time.time()
report_dir = report_dir or paths.reports_dir(profile)
setup = pcl.setup(profile, clevr_root, runs_dir=runs_dir, backbone=backbone, device=device)
results = pcl.runs(setup, ["full"], seeds)
# the same model on the faithful CLEVR-Change jitter, which the cpu budget does not learn (synthetic data only)
hard, hard_results = pcl.hard_runs(setup, ["full"], seeds)
# DUDA, the field's explicit-difference baseline, on the same data and grid features
duda_setup = duda.setup(profile, clevr_root, runs_dir=runs_dir, backbone=backbone, device=device)
duda_results = duda.runs(duda_setup, ["duda"], seeds)
_, duda_hard = duda.hard_runs(duda_setup, ["duda"], seeds)
# the no-learning baselines on the same test pairs: most frequent caption, nearest pixel difference, judge oracle
base = yardsticks.clevr_baselines(setup.data, setup.runs_dir)
dataset = yardsticks.dataset_title(setup.data)
FULL = "MLM + MVCL + FDA (full)"

# %% [markdown]
# ## The paper's table, the kit's runs and the no-learning baselines (x100)

# %%
rows = yardsticks.clevr_rows(setup, results + duda_results)
hard_rows = reporting.rows(hard_results) + reporting.rows(duda_hard)
base_rows = yardsticks.baseline_rows(base)
released_rows = released.pcl_rows(setup, released_checkpoint)  # the authors' weights, scored by the kit: a side row
comparison(rows + hard_rows + base_rows + released_rows, paper_table("pcl.table2")["rows"],
           caption=f"Table 2: the paper (real CLEVR-Change) and the kit ({dataset}), test")

# %% [markdown]
# ## Does it describe the change, or only tell a change from no change?
# CIDEr-D on the changed (semantic) and the distractor pairs apart, the judge's accuracy, and how often the
# captions name the right change type and the changed object (read against each scene's change record).

# %%
yardsticks.describe_table(rows + hard_rows + base_rows + released_rows,
                          caption=f"What the captions say ({dataset}, test)")

# %% [markdown]
# ## Where IDC-PCL stands against DUDA and the baselines (gaps read against the noise)

# %%
standing = yardsticks.standing_notes(rows + base_rows, FULL)
Notes(standing)

# %% [markdown]
# ## Val CIDEr-D against fine-tuning steps (the checkpoint is chosen here, never on test)

# %%
fig, curve = val_curve(results, title=f"IDC-PCL (full): val CIDEr-D, {dataset}")
curve

# %% [markdown]
# ## Does the model look at the images?
# Distinct test captions per run: a run that writes one sentence for every pair is scored on that sentence alone.

# %%
diversity, collapse_notes = collapse_check(setup.runs_dir, results + hard_results + duda_results + duda_hard)
diversity

# %% [markdown]
# ## A few test pairs: the references and what each run wrote (and the judge oracle)

# %%
shown = {**captions_by_run(setup.runs_dir, results + duda_results), "judge oracle": base[2]["predictions"]}
fig = show_pairs(setup.data.dataset().pairs("test"), captions=shown)

# %%
hard_notes = [f"Rows marked [hard data] ran on {hard.data.description}: CLEVR-Change's own camera and lamp jitter, "
              "kept beside the learnable default so the table shows what the difficulty changes."] if hard else []
path = write_report(
    report_dir, "table2_clevr_change", "pcl.table2", rows + hard_rows + base_rows + released_rows,
    pcl.provenance(setup, results, seeds, time.time() - t0),
    headline=yardsticks.headline(rows + base_rows, FULL, "IDC-PCL CIDEr-D, test total",
                                 paper_value("pcl.table2", "CIDEr-D", model="IDC-PCL")),
    notes=[f"Distractor-judging accuracy on test: {results[0]['judge_accuracy']:.3f}."]
    + hard_notes + standing + collapse_notes)
legend()

# %%
report_summary(path)
