"""What does IDC-PCL learn on SynthBirds at the cpu profile? One Birds-to-Words run per call, with overrides.

At the cpu profile's own settings (150 pre-training, 300 masked fine-tuning steps on 600 pairs) both table-1 runs
write one paragraph for every test pair (docs/birds.md). This script trains one ``pcl-birds/<variant>`` at the cpu
profile plus ``--overrides`` (deep-merged into ``configs/pcl_birds.json``), on the default SynthBirds or on
``--data-root`` (e.g. ``idckit generate birds --pairs 3000``), and records test ROUGE-L / CIDEr-D / BLEU-4, the
grammar's verified share and difference recall, distinct test paragraphs, and the two text baselines.

    .venv/bin/python -m lab.scripts.birds_learnability --variant b2w --tag _every \\
        --overrides '{"finetune": {"targets": "every", "group_by_pair": true, "captions_per_pair": 4}}'

Writes ``lab/records/learnability/birds_<variant>_<data>_seed<S><tag>.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lab.scripts import LEARNABILITY as OUT


def run(variant: str, seed: int, data_root: Path | None, runs_dir: Path | None, overrides: dict, threads: int,
        tag: str, out_dir: Path) -> dict:
    import torch

    from idckit.experiments import birds
    from idckit.experiments.analytics import output_diversity
    from idckit.reports.report import git_commit

    torch.set_num_threads(threads)
    t0 = time.time()
    s = birds.setup("cpu", data_root, runs_dir=runs_dir, overrides=overrides, progress=False)
    r = birds.run_variant(s, variant, seed, progress=False)
    div = output_diversity(s.runs_dir, [r])[0]
    base = birds.baselines(s)
    out = {"variant": variant, "seed": seed, "data": s.data.root.name, "overrides": overrides,
           "commit": git_commit(), "threads": threads, "run": r["run"], "best_step": r.get("best_step"),
           "test": r["test"]["total"], "verified_share": r.get("verified_share"),
           "difference_recall": r.get("difference_recall"), "distinct_test_paragraphs": div["distinct"],
           "test_pairs": div["pairs"], "top_paragraph": div["top_caption"],
           "finetune_seconds": r.get("finetune_seconds"), "history": r.get("history"),
           "baselines": [{k: b.get(k) for k in ("label", "test", "verified_share", "difference_recall")}
                         for b in base],
           "wall_seconds": round(time.time() - t0, 1)}
    t = out["test"]
    print(f"{variant}{tag} seed {seed} on {out['data']}: best step {out['best_step']}, test ROUGE-L "
          f"{100 * t['ROUGE_L']:.1f} CIDEr-D {100 * t['CIDEr-D']:.1f} BLEU-4 {100 * t['Bleu_4']:.1f}, verified "
          f"{out['verified_share']:.3f}, recall {out['difference_recall']:.3f}, {out['distinct_test_paragraphs']} "
          f"distinct of {out['test_pairs']}", flush=True)
    for b in out["baselines"]:
        bt = b["test"]["total"]
        print(f"  {b['label']}: ROUGE-L {100 * bt['ROUGE_L']:.1f} CIDEr-D {100 * bt['CIDEr-D']:.1f}, verified "
              f"{b['verified_share']:.3f}")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"birds_{variant}_{out['data']}_seed{seed}{tag}.json"
    path.write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {path}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", default="b2w", help="a pcl-birds recipe variant (`idckit list 'pcl-birds/*'`)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-root", type=Path, default=None, help="a SynthBirds root (default: the profile's)")
    p.add_argument("--runs-dir", type=Path, default=None)
    p.add_argument("--overrides", type=json.loads, default={},
                   help='settings over the cpu profile, JSON, e.g. \'{"finetune": {"targets": "every"}}\'')
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tag", default="", help="appended to the JSON's name")
    p.add_argument("--out-dir", type=Path, default=OUT)
    a = p.parse_args(argv)
    run(a.variant, a.seed, a.data_root, a.runs_dir, a.overrides, a.threads, a.tag, a.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
