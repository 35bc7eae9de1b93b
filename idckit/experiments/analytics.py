"""Caption analytics of finished runs: what each run wrote for its test pairs, whether it collapsed to a few
sentences, and the captions a report prints beside the images. Reads the run cache
(:func:`idckit.experiments.runs.test_captions`), never trains."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

from idckit.experiments.runs import test_captions
from idckit.reports.format import Table
from idckit.reports.status import is_collapsed


def captions_by_run(runs_dir: str | Path, results: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """``{run label: {pair id: test caption}}`` for finished captioning runs; the label names the seed when the
    results hold several seeds of one variant (what :func:`idckit.reports.plots.show_pairs` prints beside the images)."""
    labels = Counter(r.get("label", r["run"]) for r in results)
    out = {}
    for r in results:
        label = r.get("label", r["run"])
        if labels[label] > 1 and r.get("seed") is not None:
            label = f"{label}, seed {r['seed']}"
        captions = test_captions(Path(runs_dir) / r["run"])
        if captions:
            out[label] = captions
    return out


def output_diversity(runs_dir: str | Path, results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per finished captioning run: how many distinct captions it wrote for its test pairs.

    A short run can collapse to one caption for every pair; its scores then measure which sentence it settled on,
    not what it saw, and a table should say so beside the number."""
    out = []
    for r in results:
        captions = list(test_captions(Path(runs_dir) / r["run"]).values())
        if not captions:
            continue
        top = Counter(captions).most_common(1)[0]
        out.append({"run": r["run"], "label": r.get("label", r["run"]), "seed": r.get("seed"),
                    "pairs": len(captions), "distinct": len(set(captions)), "top_caption": top[0],
                    "top_share": top[1] / len(captions), "stopped_early": stopped_early(r)})
    return out


def stopped_early(result: Mapping[str, Any]) -> str | None:
    """The clause a report adds for a run the training loop stopped because val wrote one sentence, or at most the
    rule's ``distinct`` (``stop_on_collapse`` in configs/train.json), else None."""
    if result.get("stopped") != "collapsed":
        return None
    n = (result.get("stop_on_collapse") or {}).get("distinct", 1)
    wrote = "one sentence" if n == 1 else f"at most {n} distinct sentences"
    return (f"training stopped at step {result.get('steps')} of {result.get('max_steps')}, val having written {wrote} "
            "at consecutive evaluations")


def diversity_notes(diversity: Sequence[Mapping[str, Any]]) -> list[str]:
    """Report sentences for runs whose test output collapsed (:func:`idckit.reports.status.is_collapsed`: too few
    distinct captions, or one caption for most pairs)."""
    notes = []
    for d in diversity:
        if is_collapsed(d["distinct"], d["pairs"], d["top_share"]):
            seed = f", seed {d['seed']}" if d.get("seed") is not None else ""
            stop = f"; {d['stopped_early']}" if d.get("stopped_early") else ""
            notes.append(f"COLLAPSED: {d['label']}{seed} wrote \"{d['top_caption']}\" for "
                         f"{100 * d['top_share']:.0f} % of the {d['pairs']} test pairs ({d['distinct']} distinct "
                         f"captions); its scores reflect those few sentences, not the images{stop}.")
        elif d.get("stopped_early"):
            seed = f", seed {d['seed']}" if d.get("seed") is not None else ""
            notes.append(f"STOPPED EARLY: {d['label']}{seed}: {d['stopped_early']}; on test it wrote "
                         f"{d['distinct']} distinct captions.")
    return notes


def diversity_table(diversity: Sequence[Mapping[str, Any]]) -> Table:
    """The diversity rows as a report table (the run's label and seed, distinct captions, the most frequent one
    and its share in percent)."""
    return Table([{"run": d["label"], "seed": d.get("seed"), "distinct": d["distinct"], "pairs": d["pairs"],
                   "top_caption": d["top_caption"], "top_share": 100.0 * d["top_share"]} for d in diversity],
                 ["run", "seed", "distinct", "pairs", "top_caption", "top_share"],
                 caption="Distinct test captions per run (fewer than 10 = collapsed)")


def collapse_check(runs_dir: str | Path, results: Sequence[Mapping[str, Any]]) -> tuple[Table, list[str]]:
    """What a table notebook shows under "Does the model look at the images?": the per-run diversity table, and
    the COLLAPSED notes that go into its report (shown once, in the report's notes)."""
    diversity = output_diversity(runs_dir, results)
    return diversity_table(diversity), diversity_notes(diversity)


def timing_table(results: Sequence[Mapping[str, Any]], fields: Mapping[str, str], *, caption: str) -> Table:
    """Minutes per run of each result field in ``fields`` (``{result key in seconds: column name}``)."""
    recs = [{"run": r.get("label", r["run"]), "seed": r.get("seed"),
             **{name: (r[k] / 60 if isinstance(r.get(k), (int, float)) else None) for k, name in fields.items()}}
            for r in results]
    return Table(recs, ["run", "seed", *fields.values()], caption=caption)


__all__ = ["timing_table", "captions_by_run", "output_diversity", "diversity_notes", "diversity_table",
           "collapse_check", "stopped_early"]
