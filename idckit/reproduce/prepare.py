"""The prepare stage of ``idckit reproduce``: every dataset and grid feature store the selected notebooks read, built
before they run through the same setup functions the notebooks call (so they then find them cached).

With one lane :func:`prepare` builds them all before the first notebook; with several each step is a lane job of its
own (:func:`prepare_one`, scheduled by :mod:`idckit.reproduce.scheduler`). The experiment modules that build the
stores are imported only when a step is made: they load torch, which a lane worker must load after setting its thread
count.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Sequence

from idckit.experiments import data as data_mod
from idckit.registry import DATASETS, NOTEBOOKS, notebook_roots

#: the notebooks that also run on the synthetic hard twin (``pcl.hard_runs`` / ``duda.hard_runs``)
HARD_TWIN = ("table2_clevr_change", "table3_change_types")


def prepare_steps(names: Sequence[str], *, profile: str, roots: dict | None, runs_dir: Path,
                  device: str | None = None) -> dict[str, Callable[[], object]]:
    """``{label: build}``: every dataset (``scenes ...``) and grid feature store (``features ...``) the notebooks
    ``names`` read, each built by the setup function the notebook itself calls, so it then finds them cached.
    Datasets come before the stores computed from them; notebooks the manifest does not know add nothing."""
    steps: dict[str, Callable[[], object]] = {}
    kw = {"runs_dir": runs_dir, "device": device, "progress": False}
    for name in names:
        nb = NOTEBOOKS.get(name)
        if nb is None:
            continue
        nb_roots = notebook_roots(name, roots)
        clevr = nb_roots.get("clevr_root")
        fams = set(nb.families)
        if "clevr-change" in nb.datasets:
            steps.setdefault("scenes clevr-change", lambda r=clevr: data_mod.clevr_change(profile, r,
                                                                                             progress=False))
        if fams & {"pcl", "duda"}:
            # local: torch (~3 s) reads OMP_NUM_THREADS at import; lane workers import this before _lane_env
            from idckit.experiments import pcl

            steps.setdefault("features clevr-change", lambda r=clevr: pcl.setup(profile, r, **kw))
            if name in HARD_TWIN and not clevr and data_mod.synth_settings(profile, hard=True) != \
                    data_mod.synth_settings(profile):
                steps.setdefault("scenes clevr-change hard", lambda: data_mod.clevr_change(profile, hard=True,
                                                                                           progress=False))
                steps.setdefault("features clevr-change hard", lambda: pcl.setup(profile, hard=True, **kw))
        if "clip4idc" in fams:
            # local: torch (~3 s) reads OMP_NUM_THREADS at import; lane workers import this before _lane_env
            from idckit.experiments import clip4idc

            for ds in nb.datasets:    # its data, and the stand-in's description data where it has none
                root = nb_roots.get(DATASETS[ds].param)
                steps.setdefault(f"scenes {ds}" if ds != "clevr-change" else "clip4idc data clevr-change",
                                 lambda r=root, d=ds: clip4idc.setup(profile, r, dataset=d, **kw))
        if "birds" in fams:
            # local: torch (~3 s) reads OMP_NUM_THREADS at import; lane workers import this before _lane_env
            from idckit.experiments import birds

            root = nb_roots.get("birds_root")
            steps.setdefault("scenes birds", lambda r=root: data_mod.birds(profile, r, progress=False))
            steps.setdefault("features birds", lambda r=root: birds.setup(profile, r, **kw))
    order = sorted(steps, key=lambda label: not label.startswith("scenes"))   # stable: data before features
    return {label: steps[label] for label in order}


def prepare(names: Sequence[str], *, profile: str, roots: dict | None, runs_dir: Path,
            device: str | None = None) -> list[dict]:
    """Run :func:`prepare_steps` once each, timed. A failing step is recorded and printed, not raised: the
    notebooks that need it then fail on the same error and are marked as usual, the others still run."""
    return [_timed_step(label, build) for label, build in
            prepare_steps(names, profile=profile, roots=roots, runs_dir=runs_dir, device=device).items()]


def prepare_one(label: str, names: Sequence[str], *, profile: str, roots: dict | None, runs_dir: Path,
                device: str | None = None) -> dict:
    """Prepare step ``label`` of notebooks ``names`` as a lane job (a worker cannot be sent the step's closure)."""
    steps = prepare_steps(names, profile=profile, roots=roots, runs_dir=runs_dir, device=device)
    return _timed_step(label, steps[label])


def _timed_step(label: str, build: Callable[[], object]) -> dict:
    print(f"[prepare] {label} ...", flush=True)
    t0 = time.time()
    rec: dict = {"step": label}
    try:
        build()
        rec["ok"] = True
    except Exception as e:  # noqa: BLE001 - the notebook reading it reports the failure
        rec.update(ok=False, error=f"{type(e).__name__}: {e}".splitlines()[0][:300])
    rec["seconds"] = round(time.time() - t0, 1)
    print(f"[prepare] {label}: " + (f"{rec['seconds']:.0f} s" if rec["ok"] else f"FAILED: {rec['error']}"),
          flush=True)
    return rec

