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
# # IDC-PCL, Table 5: cross-task data on Birds-to-Words
#
# Does pre-training on other bird data help difference captioning? Four chains of runs, each fine-tuned on
# Birds-to-Words and selected on val ROUGE-L (the `cpu` profile keeps the last checkpoint, see the notes):
#
# - **B2W**: Birds-to-Words pre-training (MLM:MVCL:FDA = 9:1:2) only;
# - **+ CUB**: first a GIC stage on CUB image-caption pairs (the second image empty; FDA with Retrieve and
#   Replace negatives only);
# - **+ NABirds**: an FGVC task mixed into Birds-to-Words pre-training at 3 of every 15 steps (classification
#   and an in-batch class contrast on the single-image encoder, same-class matching on the pair encoder);
# - **+ both**.
#
# Unless `birds_root` points at the real datasets this runs on **SynthBirds** with **ImageNet EfficientNet-Lite0**
# grid features, and at the `cpu` profile small models trained for minutes. Differences between rows are only
# worth reading against the spread over seeds, which the table gives.

# %% tags=["parameters"]
profile = "cpu"        # smoke | cpu | paper
birds_root = None       # None: the SynthBirds default of the profile; else a root with birds_to_words/, CUB_200_2011/, nabirds/
runs_dir = None        # None: runs/ in the repo (runs are cached by config hash and shared with table 1)
report_dir = None      # None: reports/ in the repo (reports/<profile>/ for smoke and paper)
seeds = [0, 1, 2]
device = None          # None: auto (cuda > mps > cpu); or "cpu", "cuda:1"

# %%
from idckit.reports.notebook_params import check_parameters

check_parameters(globals())  # a misspelt `papermill -p NAME VALUE` fails here, in seconds

# %%
import time

from idckit import paths
from idckit.experiments import birds
from idckit.experiments import recipes, reporting, yardsticks
from idckit.experiments.analytics import captions_by_run, collapse_check
from idckit.reports.plots import seed_dots, show_pairs
from idckit.reports.report import paper_table, paper_value, report_summary, write_report
from idckit.reports.format import Notes, comparison, legend
from idckit.reports.stats import ordering_notes

t0 = time.time()
report_dir = report_dir or paths.reports_dir(profile)
setup = birds.setup(profile, birds_root, runs_dir=runs_dir, device=device)
results = birds.runs(setup, recipes.variants("pcl-birds"), seeds)   # `idckit list pcl-birds/*`
base = birds.baselines(setup)   # what the rows must beat: the most frequent paragraph, the nearest pair's paragraph
dataset = yardsticks.dataset_title(setup.data)

# %% [markdown]
# ## The paper's table and the kit's runs (x100; `mean` rows carry the standard deviation over seeds)

# %%
METRICS = ["Bleu_4", "METEOR", "CIDEr-D", "ROUGE_L", "verified_share", "difference_recall"]
rows = reporting.rows(results, percent=birds.GRAMMAR)
base_rows = reporting.baseline_rows(base, percent=birds.GRAMMAR)
# per-pair scores of every row (and a one-seed row's interval): what the paired orderings below resample
yardsticks.add_bootstrap(rows + base_rows, results, birds.loaded_data(setup, "b2w").splits["test"].references,
                         metrics=("ROUGE_L", "CIDEr-D"), tokenize=False, baselines=base)
paper = paper_table("pcl.table5")
comparison(rows + base_rows, paper["rows"], METRICS,
           caption=f"Table 5: the paper (real Birds-to-Words + CUB + NABirds) and the kit ({dataset}), test")

# %% [markdown]
# ## ROUGE-L and CIDEr-D per seed
# Each dot is one seed's run, the grey lines the two baselines; the paper's number (real data, its own scale) is in
# each variant's label, not on the kit's axis.

# %%
labels = [recipes.get_recipe(v, "pcl-birds").label for v in recipes.variants("pcl-birds")]
paper_idc = {r["variant"]: r["metrics"] for r in paper["rows"] if r["model"] == "IDC-PCL"}
fig = seed_dots(results, labels, base, paper_idc, title=f"Table 5: test scores per seed ({dataset})")

# %% [markdown]
# ## Does the model look at the images?

# %%
diversity, collapse_notes = collapse_check(setup.runs_dir, results)
diversity

# %% [markdown]
# ## A few test pairs: the references and what each run wrote (first seed)

# %%
first = [r for r in results if r["seed"] == seeds[0]]
fig = show_pairs(birds.shown_pairs(setup), captions=captions_by_run(setup.runs_dir, first), references=1,
                 sides=("animal1", "animal2"))

# %% [markdown]
# ## The ordering against the paper, in words, and whether extra data helps here

# %%
order_notes = ordering_notes(rows, {lb: paper_idc[lb]["ROUGE_L"] for lb in labels}, "ROUGE_L")
# the paper judges on ROUGE-L; CIDEr-D and the grammar's truth check say whether the descriptions improve too
judged = {"ROUGE_L": "ROUGE-L", "CIDEr-D": "CIDEr-D"}
if setup.data.synthetic:
    judged["verified_share"] = "verified claims (%)"
helps = reporting.gap_notes(rows, "B2W", labels[1:], judged, subject="the extra data", n_seeds=len(seeds))
standing = yardsticks.standing_notes(rows + base_rows, "B2W + CUB + NABirds", "ROUGE_L")
Notes(order_notes + helps + standing)

# %%
path = write_report(
    report_dir, "table5_cross_task", "pcl.table5", rows + base_rows,
    birds.provenance(setup, results, seeds, time.time() - t0),
    headline=yardsticks.headline(rows + base_rows, "B2W + CUB + NABirds", "B2W + CUB + NABirds ROUGE-L, test",
                                 paper_value("pcl.table5", "ROUGE_L", model="IDC-PCL", variant="B2W + CUB + NABirds"),
                                 metric="ROUGE_L"),
    notes=["Scored without PTB tokenisation, as the text is pre-tokenised.",
           f"Checkpoint: {birds.selection(setup)}; the paper selects on val ROUGE-L (docs/birds.md says why the "
           "cpu profile does not)."]
    + helps + order_notes + standing + collapse_notes)
legend(["CIDEr-D", "distinct captions", "no-learning baseline", "within noise", "–"])

# %%
report_summary(path)
