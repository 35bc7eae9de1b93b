"""Can a species attribute be read from one photo's features? A linear probe per SynthBirds attribute.

For each attribute of the species (beak length, crown colour, ...), a softmax regression on the mean-pooled grid
features of a photo, trained on the CUB and NABirds photos and tested on the Birds-to-Words photos (other
individuals of the same species). "unseen" trains without a quarter of the species and tests on their photos
only, so the attribute has to be read, not remembered per species. Beside each: the majority value's share.

    .venv/bin/python scripts/birds_attribute_probe.py --data-root data/synth-birds-n600-c6-b6-s0-128px-t5x4x2x5 \\
        --store runs/features/<data>/efficientnet_lite0

Writes ``reports/learnability/birds_attribute_probe_<store>.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "learnability"


def _species_of_rows(root: Path, index: dict[str, int]):
    truth = json.loads((root / "synth_birds.json").read_text())
    nabirds = {k.replace("-", ""): v for k, v in truth["nabirds"].items()}   # file names drop the UUID's dashes
    cub_ids = dict(reversed(line.split()) for line in (root / "CUB_200_2011" / "images.txt").read_text().split("\n")
                   if line.strip())
    rows, species, source = [], [], []
    for path, row in index.items():
        stem = path.split("/")[-1].rsplit(".", 1)[0]
        if path.startswith("birds_to_words"):
            sid, src = truth["birds_to_words"][stem]["species_id"], "b2w"
        elif path.startswith("CUB_200_2011"):
            sid, src = truth["cub"][cub_ids[path.removeprefix("CUB_200_2011/images/")]]["species_id"], "cub"
        else:
            sid, src = nabirds[stem]["species_id"], "nabirds"
        rows.append(row)
        species.append(sid)
        source.append(src)
    return truth["taxonomy"]["species"], np.array(rows), np.array(species), np.array(source)


def fit_accuracy(x_train, y_train, x_test, y_test, n_classes: int) -> float:
    """Test accuracy of an L2-regularised softmax regression (LBFGS) on standardised features."""
    mu, sd = x_train.mean(0), x_train.std(0) + 1e-4
    x_train, x_test = (x_train - mu) / sd, (x_test - mu) / sd
    w = torch.zeros(x_train.shape[1], n_classes, requires_grad=True)
    b = torch.zeros(n_classes, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=300, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x_train @ w + b, y_train) + 1e-3 * (w ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return ((x_test @ w + b).argmax(1) == y_test).float().mean().item()


def probe(root: Path, store: Path, seed: int = 0) -> dict:
    index = json.loads((store / "index.json").read_text())
    meta = json.loads((store / "meta.json").read_text())
    species, rows, sp, src = _species_of_rows(root, index)
    feats = np.load(store / "features.npy", mmap_mode="r")
    pooled = torch.tensor(np.asarray(feats[rows], dtype=np.float32)).mean(1)
    unseen = set(np.random.default_rng(seed).choice(len(species), len(species) // 4, replace=False).tolist())
    train, test = src != "b2w", src == "b2w"
    held = np.isin(sp, list(unseen))
    out = {"data": root.name, "store": store.name, "image_size": meta.get("image_size"), "grid": meta["shape"][1],
           "attributes": {}}
    for attr in sorted(species[0]["attrs"]):
        values = sorted({str(s["attrs"][attr]) for s in species})
        y = torch.tensor([values.index(str(species[s]["attrs"][attr])) for s in sp])
        row = {"values": len(values)}
        for name, tr, te in (("seen", train, test), ("unseen", train & ~held, test & held)):
            row[name] = round(fit_accuracy(pooled[tr], y[tr], pooled[te], y[te], len(values)), 3)
            row[f"majority_{name}"] = round(float(np.bincount(y[te].numpy()).max() / te.sum()), 3)
        out["attributes"][attr] = row
        print(f"{attr:15s} {len(values):2d} values: seen species {row['seen']:.2f} (majority {row['majority_seen']:.2f})"
              f", unseen species {row['unseen']:.2f} (majority {row['majority_unseen']:.2f})", flush=True)
    out["species_seen"] = round(fit_accuracy(pooled[train], torch.tensor(sp[train]), pooled[test],
                                             torch.tensor(sp[test]), len(species)), 3)
    print(f"species (of {len(species)}): {out['species_seen']:.2f}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-root", type=Path, required=True, help="a SynthBirds root (synth_birds.json inside)")
    p.add_argument("--store", type=Path, required=True, help="a feature store of that root's images")
    p.add_argument("--out-dir", type=Path, default=OUT)
    a = p.parse_args(argv)
    out = probe(a.data_root, a.store)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    path = a.out_dir / f"birds_attribute_probe_{a.data_root.name}_{a.store.name}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
