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
released_checkpoint = None  # None: no row; else the authors' IDC-PCL checkpoint (their file, or an imported run)

# %%
from idckit.reports.notebook_params import check_parameters

check_parameters(globals())  # a misspelt `papermill -p NAME VALUE` fails here, in seconds

# %%
import time

from idckit import paths
from idckit.authors import released
from idckit.experiments import pcl
from idckit.eval.probe import difference_probe
from idckit.experiments import recipes, yardsticks
from idckit.experiments.analytics import captions_by_run, collapse_check
from idckit.reports.plots import show_pairs, side_by_side_bars
from idckit.reports.report import paper_table, paper_value, report_summary, write_report
from idckit.reports.format import Notes, comparison, legend
from idckit.reports.stats import ordering_notes

t0 = time.time()
report_dir = report_dir or paths.reports_dir(profile)
setup = pcl.setup(profile, clevr_root, runs_dir=runs_dir, backbone=backbone, device=device)
results = pcl.runs(setup, recipes.variants("pcl"), seeds)   # every pcl/* recipe: `idckit list pcl/*`
base = yardsticks.clevr_baselines(setup.data, setup.runs_dir)   # the no-learning baselines (cached with table 2's)
dataset = yardsticks.dataset_title(setup.data)

# %% [markdown]
# ## The ladder: the paper's rows, the kit's and the no-learning baselines (x100)

# %%
rows = yardsticks.clevr_rows(setup, results)
base_rows = yardsticks.baseline_rows(base)
released_rows = released.pcl_rows(setup, released_checkpoint)  # the authors' weights, scored by the kit: a side row
paper = paper_table("pcl.table4")
comparison(rows + base_rows + released_rows, paper["rows"],
           caption=f"Table 4: the paper (real CLEVR-Change) and the kit ({dataset}), test")

# %%
order = [recipes.get_recipe(v, "pcl").label for v in recipes.variants("pcl")]
kit = {r["variant"]: r["metrics"]["CIDEr-D"] for r in rows if r["seed"] in ("mean", seeds[0]) or len(seeds) == 1}
paper_by = dict(zip(order, [p["metrics"]["CIDEr-D"] for p in paper["rows"]]))
fig = side_by_side_bars(kit, paper_by, order, title=f"Table 4 ablation: test CIDEr-D, paper vs the kit ({dataset})")

# %% [markdown]
# ## What each row says about the change
# CIDEr-D on the changed (semantic) and the distractor pairs apart, the judge, distinct captions, and how often the
# captions name the change type and the changed object.

# %%
yardsticks.describe_table(rows + base_rows, caption=f"What the captions say ({dataset}, test)")

# %% [markdown]
# ## Does the kit's ladder have the paper's shape?
# Each pair of rows the paper orders is read against the kit's noise (seed sd, or a bootstrap interval over test
# pairs with one seed): "within noise" where the gap is not larger.

# %%
key_pairs = [(order[3], order[0]), (order[3], order[4]), (order[3], order[5]), (order[2], order[1]),
             (order[1], order[0])]
notes = [n for a, b in key_pairs for n in ordering_notes(rows, {a: paper_by[a], b: paper_by[b]})]
notes += yardsticks.standing_notes(rows + base_rows, order[3])
Notes(notes)

# %% [markdown]
# ## How hard are the features themselves?
# A linear probe on per-region feature distances tells real changes from distractors this well (chance is 50 %).

# %%
probe = difference_probe(pcl.loaded_data(setup))
notes.append(f"A linear probe on per-region feature distances separates changes from distractors at "
             f"{100 * probe['test_accuracy']:.1f} % on test (chance {100 * probe['chance']:.0f} %).")
Notes(notes[-1:])

# %% [markdown]
# ## Does the model look at the images?
# Distinct test captions per run: a run that writes one sentence for every pair is scored on that sentence alone.

# %%
diversity, collapse_notes = collapse_check(setup.runs_dir, results)
diversity

# %% [markdown]
# ## A few test pairs: the references and what each run wrote

# %%
fig = show_pairs(setup.data.dataset().pairs("test"), captions=captions_by_run(setup.runs_dir, results))

# %%
path = write_report(
    report_dir, "table4_ablation", "pcl.table4", rows + base_rows + released_rows,
    pcl.provenance(setup, results, seeds, time.time() - t0),
    headline=yardsticks.headline(rows + base_rows, order[3], "full model CIDEr-D, test total",
                                 paper_value("pcl.table4", "CIDEr-D", model="IDC-PCL", variant="MLM+MVCL+FDA")),
    notes=notes + collapse_notes)
legend()

# %%
report_summary(path)
