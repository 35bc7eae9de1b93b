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
# # CLIP4IDC, Table 7: where to split the ViT into intra- and inter-image layers
#
# For every split N_intra / N_inter, from half the depth to all of it (the paper's 6/6 ... 12/0 of a 12-layer
# ViT-B/32): retrieval adaptation with that split, then captioning on the **frozen** adapted encoder (only the
# captioner trains, as in the paper's table), so the caption columns measure the adapted representation. One shared
# CLIP; only what differs per split is trained (at `cpu` the default split's captioning run is Table 1's seed-0
# run, from the cache, because Table 1 freezes the encoder there too).
#
# **How the paper's splits map to the kit's CLIP.** A split is a depth fraction N_intra / depth. The `cpu` profile's
# stand-in CLIP (`idckit-standin-ViT-12`) has 12 layers like ViT-B/32, so all seven of the paper's splits run, 6/6
# to 12/0, with the paper's default 9/3 (three quarters of the depth). The `smoke` profile's 6-layer stand-in has
# 3/3, 4/2, 5/1 and 6/0, at the paper's 6/6, 8/4, 10/2 and 12/0 (the odd splits fall between two of its layers; its
# default is 4/2, the floor of 4.5). With OpenAI's ViT-B/32 (`clip_model="ViT-B-32"`, `pretrained="openai"`) the
# seven splits are the paper's own.
# Unless `clevr_root` is real this is SynthCLEVR-Change; at `smoke`/`cpu` the CLIP is the **idckit stand-in CLIP
# (synthetic pre-training)**.

# %% tags=["parameters"]
profile = "cpu"        # smoke | cpu | paper
clevr_root = None       # None: the synthetic default of the profile; else a real CLEVR-Change root
runs_dir = None        # None: runs/ in the repo
report_dir = None      # None: reports/ in the repo (reports/<profile>/ for smoke and paper)
seeds = [0]            # one run per split, as the paper (the first seed is used)
device = None          # None: auto (cuda > mps > cpu); or "cpu", "cuda:1"
clip_model = None      # None: the profile's CLIP (the stand-in at smoke and cpu); e.g. ViT-B-32
pretrained = None      # None: the profile's weights; e.g. openai or a checkpoint file

# %%
from idckit.reports.notebook_params import check_parameters

check_parameters(globals())  # a misspelt `papermill -p NAME VALUE` fails here, in seconds

# %%
import time

from idckit import paths
from idckit.experiments import clip4idc
from idckit.experiments import reporting, yardsticks
from idckit.experiments.analytics import captions_by_run, collapse_check
from idckit.reports.plots import show_pairs, source_panels
from idckit.reports.report import paper_table, paper_value, report_summary, write_report
from idckit.reports.format import Table, comparison, legend

t0 = time.time()
report_dir = report_dir or paths.reports_dir(profile)
setup = clip4idc.setup(profile, clevr_root, runs_dir=runs_dir, clip_model=clip_model, pretrained=pretrained,
                       device=device)
seed = seeds[0]
splits = clip4idc.layer_splits(setup)
adapted = [clip4idc.adapt(setup, sp["n_intra"], seed) for sp in splits]
captioned = [clip4idc.run_variant(setup, "clip4idc", seed, n_intra=sp["n_intra"], freeze_visual=True)
             for sp in splits]
dataset = yardsticks.dataset_title(setup.data)
base = yardsticks.clevr_baselines(setup.data, setup.runs_dir)   # the no-learning baselines on the same test pairs
Table(splits, caption="The layer splits (the kit's ViT depth, and the paper's split each stands for)")

# %% [markdown]
# ## Retrieval and captioning per split (R@K and captioning x100; ranks 1-based)
# The last row is retrieval chance: a random ranking of the test pairs.

# %%
n_pairs = clip4idc.test_pairs_retrieved(setup)
rows = reporting.layer_split_rows(splits, adapted, captioned, n_pairs)
yardsticks.add_bootstrap(rows, captioned, setup.data.dataset().references("test"))
base_rows = yardsticks.baseline_rows(base)
comparison(rows + [reporting.chance_row(n_pairs)] + base_rows, paper_table("clip4idc.table7")["rows"],
           ("p2t_R@1", "t2p_R@1", "t2p_MnR", "Bleu_4", "CIDEr-D"), caption=f"Table 7: layer splits ({dataset}), test")

# %% [markdown]
# ## Against the depth fraction N_intra / depth: the kit's curves and the paper's, each on its own axes

# %%
points = [{"source": f"idckit ({dataset})", "N_intra / depth": sp["relative_depth"],
           **{m: r["metrics"][m] for m in ("t2p_R@1", "CIDEr-D")}} for sp, r in zip(splits, rows)]
points += [{"source": "paper (real CLEVR-Change)", "N_intra / depth": r["n_intra"] / 12,
            **{m: r["metrics"][m] for m in ("t2p_R@1", "CIDEr-D")}} for r in paper_table("clip4idc.table7")["rows"]]
fig = source_panels(points, x="N_intra / depth", metrics=("t2p_R@1", "CIDEr-D"),
                    title="Table 7: test text->pair R@1 and CIDEr-D against the layer split")

# %% [markdown]
# ## Does the captioner look at the images?
# Distinct test captions per split's run; a run that writes one sentence for every pair is scored on that sentence.

# %%
by_split = [{**c, "label": f"split {sp['label']}"} for sp, c in zip(splits, captioned)]
diversity, collapse_notes = collapse_check(setup.runs_dir, by_split)
diversity

# %% [markdown]
# ## A few test pairs: the references and what each run wrote

# %%
fig = show_pairs(setup.data.dataset().pairs("test"), captions=captions_by_run(setup.runs_dir, by_split))

# %%
depth = clip4idc.depth(setup)
best, which = yardsticks.best_split(rows, depth)
no_inter = next(r for r in rows if r["n_intra"] == depth)
paper_best = max(paper_table("clip4idc.table7")["rows"], key=lambda r: r["metrics"]["CIDEr-D"])
path = write_report(
    report_dir, "clip4idc_table7_layer_split", "clip4idc.table7", rows + base_rows,
    clip4idc.provenance(setup, captioned, [seed], time.time() - t0,
                        selection="val (text->pair R@1 for adaptation, CIDEr-D for captioning)"),
    headline={"label": "best split by test CIDEr-D, as N_intra / depth" + (f" ({which})" if best is None else ""),
              "kit": best, "paper": round(paper_best["n_intra"] / (paper_best["n_intra"] + paper_best["n_inter"]), 3),
              "metric": "split_ratio", "runs": {"variants": [r["variant"] for r in rows]}},
    notes=[f"CLIP: {adapted[0]['clip']}.",
           f"Best split by test CIDEr-D: {which} (one seed: a bootstrap over test pairs).",
           f"The kit's ViT has {depth} layers, the paper's ViT-B/32 12: the kit's split k/{depth}-k sits "
           f"at the paper's 12k/{depth} (splits: " + ", ".join(
               f"{sp['label']} = paper {sp['paper_split'] or 'none'}" for sp in splits) + ").",
           f"Without inter layers ({no_inter['variant']}) text->pair R@1 is {no_inter['metrics']['t2p_R@1']:.1f} "
           f"(paper {paper_value('clip4idc.table7', 't2p_R@1', variant='12/0'):.1f} at 12/0): the pair vector then "
           "cannot see the change.",
           "Captioning here keeps the adapted encoder frozen (paper table 7).", *collapse_notes])
legend(["R@K", "median / mean rank", "CIDEr-D", "within noise", "–"])

# %%
report_summary(path)
