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
# # IDC-PCL, Table 1: Birds-to-Words
#
# IDC-PCL pre-trained (MLM, MVCL, FDA with Confuse negatives that swap `animal1` and `animal2`) and fine-tuned on
# Birds-to-Words, and the same with the extra data of table 5 (a GIC stage on CUB image-caption pairs, an FGVC
# task on NABirds pairs), selected on val ROUGE-L (the paper's main metric; the `cpu` profile keeps the last
# checkpoint, see the notes), scored on test without PTB tokenisation (the paragraphs are pre-tokenised), beside
# two baselines that compose nothing: the most frequent training paragraph, and the paragraph of the training pair
# nearest in the features of both images.
#
# Unless `birds_root` points at the real datasets this runs on **SynthBirds** (procedural birds whose species
# differ in named attributes, paragraphs from a grammar) with **ImageNet EfficientNet-Lite0** grid features in
# place of ResNet-101, and at the `cpu` profile a small model trained for minutes. The paper's numbers are shown
# beside the kit's, never mixed with them.

# %% tags=["parameters"]
profile = "cpu"        # smoke | cpu | paper
birds_root = None       # None: the SynthBirds default of the profile; else a root with birds_to_words/, CUB_200_2011/, nabirds/
runs_dir = None        # None: runs/ in the repo (runs are cached by config hash and shared with table 5)
report_dir = None      # None: reports/ in the repo (reports/<profile>/ for smoke and paper)
seeds = [0]
device = None          # None: auto (cuda > mps > cpu); or "cpu", "cuda:1"

# %%
from idckit.reports.notebook_params import check_parameters

check_parameters(globals())  # a misspelt `papermill -p NAME VALUE` fails here, in seconds

# %%
import time

from idckit import paths
from idckit.experiments import birds
from idckit.experiments import reporting, yardsticks
from idckit.experiments.analytics import captions_by_run, collapse_check
from idckit.reports.plots import show_pairs, side_by_side_bars
from idckit.reports.report import paper_table, paper_value, report_summary, write_report
from idckit.reports.format import Notes, Table, comparison, legend
from idckit.reports.stats import ordering_notes

t0 = time.time()
report_dir = report_dir or paths.reports_dir(profile)
setup = birds.setup(profile, birds_root, runs_dir=runs_dir, device=device)
results = birds.runs(setup, ["b2w", "both"], seeds)
base = birds.baselines(setup)
test_refs = birds.loaded_data(setup, "b2w").splits["test"].references

# %% [markdown]
# ## The paper's table and the kit's runs (x100)
# `verified_share` and `difference_recall` (SynthBirds only) are the grammar's truth check of the generated
# paragraphs: the share of their claims that hold for the pair, and the share of the pair's differing attributes
# that a true claim names.

# %%
METRICS = ["Bleu_4", "METEOR", "CIDEr-D", "ROUGE_L", "verified_share", "difference_recall"]
rows = reporting.rows(results, labels=birds.TABLE1_LABELS, percent=birds.GRAMMAR)
rows += reporting.baseline_rows(base, percent=birds.GRAMMAR)
yardsticks.add_bootstrap(rows, results, test_refs, metrics=("ROUGE_L", "CIDEr-D"), tokenize=False, baselines=base)
paper = paper_table("pcl.table1")
comparison(rows, paper["rows"], METRICS, caption="Table 1: the paper (real Birds-to-Words) and the kit "
           f"({yardsticks.dataset_title(setup.data)}), test")

# %% [markdown]
# ## ROUGE-L, the paper's rows and the kit's (each on its own axis: the data differ)

# %%
kit_rouge = reporting.per_variant(rows, "ROUGE_L")
paper_rouge = {r["model"]: r["metrics"]["ROUGE_L"] for r in paper["rows"]}
order = list(paper_rouge) + [k for k in kit_rouge if k not in paper_rouge]
fig = side_by_side_bars(kit_rouge, paper_rouge, order, value="ROUGE-L", paper_label="paper (real Birds-to-Words)",
                        kit_label=f"idckit ({yardsticks.dataset_title(setup.data)})",
                        title="Table 1: test ROUGE-L, the paper's rows and the kit's")

# %% [markdown]
# ## ROUGE-L per pivot-branch selection (how far apart the two birds are in the taxonomy)

# %%
Table(reporting.selection_rows(results), caption="Test ROUGE-L (x100) per pivot-branch selection")

# %% [markdown]
# ## Does the model look at the images?
# Distinct test paragraphs per run: a run that writes one paragraph for every pair is a text-only baseline.

# %%
diversity, collapse_notes = collapse_check(setup.runs_dir, results)
diversity

# %% [markdown]
# ## A few test pairs: the references and what each run wrote

# %%
captions = {**captions_by_run(setup.runs_dir, results), "nearest neighbour": base[1]["captions"]}
fig = show_pairs(birds.shown_pairs(setup), captions=captions, references=1, sides=("animal1", "animal2"))

# %% [markdown]
# ## The ordering against the paper and the baselines, read against the noise
# The noise is the seed sd, or with one seed a 95 % bootstrap interval over the test pairs.

# %%
order_notes = ordering_notes(rows, {k: paper_rouge[k] for k in birds.TABLE1_LABELS.values()}, "ROUGE_L")
margins = [n for v in birds.TABLE1_LABELS.values() for m in ("ROUGE_L", "CIDEr-D")
           for n in yardsticks.standing_notes([r for r in rows if r["variant"] == v
                                               or r["model"] == reporting.BASELINE_MODEL], v, m)]
Notes(order_notes + margins)

# %%
path = write_report(
    report_dir, "table1_birds_to_words", "pcl.table1", rows,
    birds.provenance(setup, results, seeds, time.time() - t0),
    headline=yardsticks.headline(rows, "IDC-PCL", "IDC-PCL ROUGE-L, test",
                                 paper_value("pcl.table1", "ROUGE_L", model="IDC-PCL"), metric="ROUGE_L"),
    notes=["Scored without PTB tokenisation, as the text is pre-tokenised.",
           f"Checkpoint: {birds.selection(setup)}; the paper selects on val ROUGE-L (docs/birds.md says why the "
           "cpu profile does not)."]
    + margins + order_notes + collapse_notes)
legend(["CIDEr-D", "distinct captions", "no-learning baseline", "within noise", "–"])

# %%
report_summary(path)
