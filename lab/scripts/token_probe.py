"""Does a CLIP4IDC pair encoder's token grid show *whether* a SynthSpot-the-Diff pair changed? One probe per layer.

For each pair the score is the largest relative change of a patch token between the two images,
``max_i |a_i - b_i| / |b_i|`` (class token left out), after the patch embedding, after each intra block and, with
``--adapt``, at the captioner's input (inter blocks, ``ln_post``, ``proj``). One threshold is fitted on training pairs
and scored on the test pairs; the truth is the generator's ``changes.json`` (an empty list: only light and noise
differ). A layer near the majority share cannot tell a change from the light; the captioner cannot say what it
does not see there.

    .venv/bin/python -m lab.scripts.token_probe --data-root /path/to/synth-spot --model idckit-standin-hybrid-ViT-12 \\
        --weights runs/clip-standin-.../clip.pt [--adapt runs/clip4idc-adapt-.../best.pt]

Writes ``lab/records/learnability/token_probe_<data>_<model>[_adapted].json``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from idckit.fileio import write_json

from lab.scripts import LEARNABILITY as OUT


def split_ids(root: Path, split: str) -> list[int]:
    return sorted({int(e["img_id"]) for e in json.loads((root / "annotations" / f"{split}.json").read_text())})


def layer_scores(encoder, images, ids: list[int], batch: int = 64) -> list:
    """[layers][pairs] scores: the largest relative patch-token change per pair after each stage."""
    import torch

    paths = [f"resized_images/{i}{suffix}.png" for i in ids for suffix in ("", "_2")]
    n = encoder.tokens_per_image
    per_layer: list[list[torch.Tensor]] = []
    for start in range(0, len(ids), batch):
        x = images.batch(images.rows(paths[2 * start: 2 * (start + batch)]))
        with torch.no_grad():
            h = encoder.embed(x)
            stages = [h]
            for block in range(encoder.n_intra):
                h = encoder.run_blocks(h, block, block + 1)
                stages.append(h)
            tokens, _ = encoder.forward_from_intra(h[0::2], h[1::2])
        pairs = [(s[0::2, 1:], s[1::2, 1:]) for s in stages] + [(tokens[:, 1:n], tokens[:, n + 1:])]
        for k, (b, a) in enumerate(pairs):
            score = ((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-6)).amax(dim=1)
            if k == len(per_layer):
                per_layer.append([])
            per_layer[k].append(score)
    return [torch.cat(s).numpy() for s in per_layer]


def threshold_accuracy(train, y_train, test, y_test) -> tuple[float, float]:
    """The one threshold best on train (score > t means changed) and its accuracy on train and test."""
    import numpy as np

    candidates = np.unique(train)
    acc = np.array([((train > t) == y_train).mean() for t in candidates])
    t = candidates[int(acc.argmax())]
    return float(acc.max()), float(((test > t) == y_test).mean())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--model", required=True, help="the stand-in's architecture name")
    p.add_argument("--weights", required=True, help="its clip.pt (a clip-standin run)")
    p.add_argument("--adapt", default=None, help="an adaptation run's best.pt: its pair encoder is probed")
    p.add_argument("--train-pairs", type=int, default=800)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out-dir", type=Path, default=OUT)
    a = p.parse_args(argv)

    import numpy as np
    import torch

    from idckit.data.images import ImageCache
    from idckit.models.clip4idc import PairEncoder
    from idckit.models.clip_loader import load_clip

    torch.set_num_threads(a.threads)
    root = a.data_root
    changes = json.loads((root / "changes.json").read_text())
    model, _, _ = load_clip(a.model, a.weights)
    encoder = PairEncoder(model.visual).eval()
    if a.adapt:
        state = torch.load(a.adapt, map_location="cpu", weights_only=False)
        state = state.get("model", state)
        prefix = "pair_encoder."
        missing, unexpected = encoder.load_state_dict(
            {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}, strict=False)
        if missing or unexpected:
            raise SystemExit(f"{a.adapt}: not a pair encoder of {a.model} (missing {missing[:3]}, unexpected "
                             f"{unexpected[:3]})")
    ids = {"train": split_ids(root, "train")[:a.train_pairs], "test": split_ids(root, "test")}
    size = model.visual.image_size[0] if isinstance(model.visual.image_size, tuple) else model.visual.image_size
    images = ImageCache.build(root, [f"resized_images/{i}{s}.png" for v in ids.values() for i in v
                                     for s in ("", "_2")], size)
    truth = {s: np.array([bool(changes[str(i)]) for i in v]) for s, v in ids.items()}
    scores = {s: layer_scores(encoder, images, v) for s, v in ids.items()}
    names = ["patch embedding"] + [f"intra block {k + 1}" for k in range(encoder.n_intra)] + ["captioner input"]
    rows = []
    for k, name in enumerate(names):
        train_acc, test_acc = threshold_accuracy(scores["train"][k], truth["train"], scores["test"][k], truth["test"])
        rows.append({"stage": name, "train_accuracy": round(train_acc, 4), "test_accuracy": round(test_acc, 4)})
        print(f"{name:>16}: threshold accuracy train {train_acc:.3f}, test {test_acc:.3f}")
    majority = float(max(truth["test"].mean(), 1 - truth["test"].mean()))
    print(f"majority class on test: {majority:.3f} ({len(ids['test'])} pairs)")
    out = {"data": root.name, "model": a.model, "weights": str(a.weights), "adapt": a.adapt,
           "train_pairs": len(ids["train"]), "test_pairs": len(ids["test"]), "test_majority": round(majority, 4),
           "layers": rows}
    path = a.out_dir / f"token_probe_{root.name}_{a.model}{'_adapted' if a.adapt else ''}.json"
    write_json(path, out, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
