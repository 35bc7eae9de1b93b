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
# # CLIP4IDC, Table 2: CLEVR-Change CIDEr-D by change type
#
# The same runs as Table 1 (cached, shared: nothing is trained here when Table 1 ran first), scored per change type
# and on the distractors. Each subset is its own corpus, so CIDEr-D's IDF is recomputed per subset (RCC's protocol;
# the public CLIP4IDC code never wired this in: GitHub issue sushizixin/CLIP4IDC#5). Unless `clevr_root` is real this is SynthCLEVR-Change,
# and at `smoke`/`cpu` the CLIP is the **idckit stand-in CLIP (synthetic pre-training)**, not OpenAI's.

# %% tags=["parameters"]
profile = "cpu"        # smoke | cpu | paper
clevr_root = None       # None: the synthetic default of the profile; else a real CLEVR-Change root
runs_dir = None        # None: runs/ in the repo (shared with Table 1)
report_dir = None      # None: reports/ in the repo (reports/<profile>/ for smoke and paper)
seeds = [0, 1, 2]      # the same seeds as Table 1, so its runs are reused
device = None          # None: auto (cuda > mps > cpu); or "cpu", "cuda:1"
clip_model = None      # None: the profile's CLIP (the stand-in at smoke and cpu); e.g. ViT-B-32
pretrained = None      # None: the profile's weights; e.g. openai or a checkpoint file
released_caption_checkpoint = None  # None: no row; else the authors' CLIP4IDC caption checkpoint (file or run)

# %%
from idckit.reports.notebook_params import check_parameters

check_parameters(globals())  # a misspelt `papermill -p NAME VALUE` fails here, in seconds

# %%
import time

from idckit import paths
from idckit.authors import released
from idckit.data.clevr_change import CHANGE_TYPES
from idckit.experiments import clip4idc
from idckit.experiments import reporting, yardsticks
from idckit.experiments.analytics import captions_by_run
from idckit.reports.plots import per_type_bars, show_pairs
from idckit.reports.report import paper_table, report_summary, write_report
from idckit.reports.format import Notes, comparison, legend

t0 = time.time()
report_dir = report_dir or paths.reports_dir(profile)
setup = clip4idc.setup(profile, clevr_root, runs_dir=runs_dir, clip_model=clip_model, pretrained=pretrained,
                       device=device)
results = clip4idc.runs(setup, ["clip4idc"], seeds)
base = yardsticks.clevr_baselines(setup.data, setup.runs_dir)   # the no-learning baselines per change type
dataset = yardsticks.dataset_title(setup.data)

# %% [markdown]
# ## CIDEr-D (x100) per change type: the paper's rows, the kit's runs and the no-learning baselines

# %%
rows = yardsticks.type_rows(setup, results)
base_rows = yardsticks.baseline_type_rows(base)
released_rows = released.clip4idc_caption_rows(setup, released_caption_checkpoint, per_type=True)  # a side row
paper = paper_table("clip4idc.table2")["rows"]
comparison(rows + base_rows + released_rows, paper, metrics=reporting.TYPES,
           caption=f"Table 2: CIDEr-D per change type, the paper (real CLEVR-Change) and the kit ({dataset}), test")

# %% [markdown]
# ## The kit beside the no-learning baselines, per change type
# (The paper's numbers are in the table above; its real-data scale is not drawn on the kit's axis.)

# %%
kit_row = next((r for r in rows if r["seed"] == "mean"), rows[0])
bars = [{"model": f"CLIP4IDC ({'mean of seeds' if kit_row['seed'] == 'mean' else 'seed ' + str(kit_row['seed'])})"
         if r is kit_row else r["variant"], "type": t, "CIDEr-D": v}
        for r in [kit_row, *base_rows] for t, v in r["metrics"].items()]
fig = per_type_bars(bars, title=f"CLIP4IDC table 2, {dataset}: test CIDEr-D per change type")

# %% [markdown]
# ## Does the caption name the change type? (per type, beside guessing the most common type)

# %%
yardsticks.type_describe_table(rows + base_rows, caption=f"Change type named, % of the changed test pairs ({dataset})")

# %% [markdown]
# ## A few test pairs: the references and what each run wrote (and the judge oracle)

# %%
shown = {**captions_by_run(setup.runs_dir, results), "judge oracle": base[2]["predictions"]}
fig = show_pairs(setup.data.dataset().pairs("test"), captions=shown)

# %%
paper_row = next(r for r in paper if r["model"] == "CLIP4IDC")
semantic = [t for t in CHANGE_TYPES if t in kit_row["metrics"]]
head = yardsticks.type_headline(rows + base_rows, results[0]["label"], "CLIP4IDC move CIDEr-D, test",
                                paper_row["metrics"], ["move"] if "move" in semantic else semantic)
notes = (yardsticks.hardest_type_notes(rows, paper_row["metrics"], results[0]["label"], semantic)
         + yardsticks.type_standing_notes(rows + base_rows, results[0]["label"], semantic))
path = write_report(
    report_dir, "clip4idc_table2_change_types", "clip4idc.table2", rows + base_rows + released_rows,
    clip4idc.provenance(setup, results, seeds, time.time() - t0), headline=head,
    notes=[f"CLIP: {results[0]['clip']}.", *notes])
Notes(notes)

# %%
legend()

# %%
report_summary(path)
