"""Does a trained captioner look at the change? The attention probe of a finished IDC-PCL run (and a DUDA run).

On the first ``--pairs`` real changes of the test split, with one reference caption each, the changed regions are
the ``--k`` whose features moved most between before and after (at camera and lamp jitter 0 the rest barely move).
``idckit.eval.probe.pcl_attention_on_change`` records the IDC-PCL run's attention during its own fine-tuning
forward: how much its pair encoder compares each region with the same region of the other image, and how much of
the words' attention lands on the visual tokens and, of that, on the changed regions. With ``--duda-run DIR`` the
share of DUDA's two spatial maps on the same regions is added for comparison.

    .venv/bin/python -m lab.scripts.attention_probe --data-root /path/to/synth-cam0 --run runs/pcl-finetune-... \\
        [--duda-run runs/duda-...]

Writes ``lab/records/learnability/attention_<data>_<run>.json``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from lab.scripts import LEARNABILITY as OUT


def _changes(data, n: int):
    import torch

    sp = data.splits["test"]
    idx = torch.nonzero(sp.is_change).squeeze(1)[:n]
    first: dict[int, int] = {}
    for s, p in enumerate(sp.sample_pair.tolist()):
        first.setdefault(p, s)
    return idx, sp.sample_ids[[first[i] for i in idx.tolist()]]


def main() -> None:
    import torch

    from idckit.eval.probe import changed_regions, pcl_attention_on_change
    from idckit.experiments import pcl
    from idckit.reports.report import git_commit

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--run", type=Path, required=True, help="a finished pcl-finetune run on this data")
    p.add_argument("--duda-run", type=Path, default=None, help="a finished duda run on this data")
    p.add_argument("--pairs", type=int, default=400)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out-dir", type=Path, default=OUT)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    t0 = time.time()
    s = pcl.setup("cpu", a.data_root, runs_dir=a.run.parent, progress=False)
    data = pcl.loaded_data(s)
    model, _ = pcl.load_run(a.run, device=s.device,
                            vocab=pcl.loaded_data(s).vocab)
    idx, ids = _changes(data, a.pairs)
    f1, f2 = data.pair_features("test", idx)
    changed = changed_regions(f1, f2, k=a.k)
    res = pcl_attention_on_change(model, f1.float(), f2.float(), ids, changed)
    for i, layer in enumerate(res["pair"]):
        print(f"pair encoder {i}: same-position weight per head {[round(v, 3) for v in layer['same_position']]}"
              f" (changed regions {[round(v, 3) for v in layer['same_position_changed']]}, uniform "
              f"{layer['uniform']:.3f})")
    for i, layer in enumerate(res["cross"]):
        print(f"cross-modal {i}: words' share on visual tokens {[round(v, 3) for v in layer['visual']]}, of it on "
              f"the changed regions {[round(v, 3) for v in layer['changed_of_visual']]} (uniform "
              f"{res['changed_share']:.3f}), on [IMG1]/[IMG2] {[round(v, 3) for v in layer['img_of_visual']]}")
    out = {"data": a.data_root.name, "run": a.run.name, "pairs": len(idx), "k": a.k, "pcl": res}
    if a.duda_run is not None:
        from idckit.models.duda import DUDA
        from idckit.tasks.duda import build_config

        cfg = json.loads((a.duda_run / "config.json").read_text())
        dmodel = DUDA(build_config(data, cfg["model"]), data.vocab)
        dmodel.load_state_dict(torch.load(a.duda_run / "best.pt", map_location="cpu", weights_only=True))
        dmodel.eval()
        with torch.inference_mode():
            att = dmodel.attention(f1.float(), f2.float())
        out["duda_run"] = a.duda_run.name
        out["duda"] = {name: float(((m * changed).sum(1) / m.sum(1)).mean())
                       for name, m in (("before_map", att.att_before), ("after_map", att.att_after))}
        out["duda"]["uniform"] = a.k / changed.shape[1]
        print(f"DUDA: share of its before / after maps on the changed regions {out['duda']['before_map']:.3f} / "
              f"{out['duda']['after_map']:.3f} (uniform {out['duda']['uniform']:.3f})")
    info = json.loads((a.data_root / "synth_info.json").read_text())
    out.update({"camera_jitter": info.get("camera_jitter"), "lamp_jitter": info.get("lamp_jitter"),
                "commit": git_commit(), "wall_seconds": round(time.time() - t0, 1)})
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / f"attention_{a.data_root.name}_{a.run.name}.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
