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
# The same runs as Table 1 (cached, shared), scored per change type and on the distractors; each subset is its own
# corpus, so CIDEr-D's IDF is recomputed per subset (RCC's protocol; the public code never wired this in).
# Unless `data_root` is real this is SynthCLEVR-Change, and at `smoke`/`cpu` the CLIP is the kit's offline stand-in.

# %% tags=["parameters"]
profile = "cpu"        # smoke | cpu | paper
data_root = None       # None: the synthetic default of the profile; else a real CLEVR-Change root
runs_dir = None        # None: runs/ in the repo (shared with Table 1)
report_dir = None      # None: reports/ in the repo
seeds = [0, 1, 2]

# %%
import time

from idckit import paths
from idckit.experiments import clip4idc
from idckit.report import paper_table, side_by_side, write_report

t0 = time.time()
report_dir = report_dir or paths.reports_dir()
setup = clip4idc.setup(profile, data_root, runs_dir=runs_dir)
seeds = seeds[:1] if profile == "smoke" else seeds
results = clip4idc.runs(setup, ["clip4idc"], seeds)
print(setup.data.description, "|", results[0]["clip"])

# %% [markdown]
# ## CIDEr-D (x100) per change type: the paper's rows and the kit's runs

# %%
rows = clip4idc.per_type_rows(results)
side_by_side(rows, paper_table("clip4idc.table2")["rows"]).round(1)

# %%
hardest = min(rows[0]["metrics"], key=rows[0]["metrics"].get)
path = write_report(
    report_dir, "clip4idc_table2_change_types", "clip4idc.table2", rows,
    clip4idc.provenance(setup, results, seeds, time.time() - t0),
    headline={"label": "CLIP4IDC move CIDEr-D, test", "kit": round(rows[0]["metrics"].get("move", 0.0), 2),
              "paper": next((r["metrics"]["move"] for r in paper_table("clip4idc.table2")["rows"]
                             if r["model"] == "CLIP4IDC"), None)},
    notes=["Synthetic-data numbers (unless data_root is real) are not comparable with the paper's real-data numbers.",
           f"Hardest subset for the kit (seed {rows[0]['seed']}): {hardest}."])
print("report written to", path)
