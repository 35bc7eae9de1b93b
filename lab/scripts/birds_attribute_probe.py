"""Can a species attribute be read from one photo's features? A linear probe per SynthBirds attribute.

For each attribute of the species (beak length, crown colour, ...), a softmax regression on the mean-pooled grid
features of a photo, trained on the CUB and NABirds photos and tested on the Birds-to-Words photos (other
individuals of the same species). "unseen" trains without a quarter of the species and tests on their photos
only, so the attribute has to be read, not remembered per species. Beside each: the majority value's share.

    .venv/bin/python -m lab.scripts.birds_attribute_probe --data-root data/synth-birds-n600-c6-b6-s0-128px-t5x4x2x5 \\
        --store runs/features/<data>/efficientnet_lite0

Writes ``lab/records/learnability/birds_attribute_probe_<store>.json``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from idckit.fileio import write_json

from lab.scripts import LEARNABILITY as OUT


def _species_of_rows(root: Path, store):
    """Each stored photo's row, species id and source (b2w, cub, nabirds), from SynthBirds' ground truth."""
    from idckit.data.synth.birds import load_truth

    truth = load_truth(root)
    nabirds = {k.replace("-", ""): v for k, v in truth["nabirds"].items()}   # file names drop the UUID's dashes
    cub_ids = dict(reversed(line.split()) for line in (root / "CUB_200_2011" / "images.txt").read_text().split("\n")
                   if line.strip())
    rows, species, source = [], [], []
    for path, row in store.index.items():
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


def probe(root: Path, store_dir: Path, seed: int = 0) -> dict:
    """Per attribute: the kit's linear probe (:func:`idckit.eval.probe.fit_type_probe` without a hidden layer) on
    seen and on held-out species; test photos whose value no training photo has are left out (and counted)."""
    from idckit.data.features import FeatureStore
    from idckit.eval.probe import fit_type_probe

    store = FeatureStore.open(store_dir)
    species, rows, sp, src = _species_of_rows(root, store)
    pooled = torch.tensor(np.asarray(store.array[rows], dtype=np.float32)).mean(1)
    unseen = set(np.random.default_rng(seed).choice(len(species), len(species) // 4, replace=False).tolist())
    train, test = src != "b2w", src == "b2w"
    held = np.isin(sp, list(unseen))
    out = {"data": root.name, "store": store.directory.name, "image_size": store.meta.get("image_size"),
           "grid": store.array.shape[1], "attributes": {}}

    def fit(labels, tr, te):
        known = set(labels[tr])
        te = te & np.array([v in known for v in labels])
        r = fit_type_probe(pooled[tr], list(labels[tr]), pooled[te], list(labels[te]), hidden=0, seed=seed)
        return round(r["test_accuracy"], 3), round(r["chance"], 3)

    for attr in sorted(species[0]["attrs"]):
        labels = np.array([str(species[s]["attrs"][attr]) for s in sp])
        row = {"values": len(set(labels))}
        for name, tr, te in (("seen", train, test), ("unseen", train & ~held, test & held)):
            row[name], row[f"majority_{name}"] = fit(labels, tr, te)
        out["attributes"][attr] = row
        print(f"{attr:15s} {row['values']:2d} values: seen species {row['seen']:.2f} (majority {row['majority_seen']:.2f})"
              f", unseen species {row['unseen']:.2f} (majority {row['majority_unseen']:.2f})", flush=True)
    out["species_seen"] = fit(sp.astype(str), train, test)[0]
    print(f"species (of {len(species)}): {out['species_seen']:.2f}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-root", type=Path, required=True, help="a SynthBirds root (synth_birds.json inside)")
    p.add_argument("--store", type=Path, required=True, help="a feature store of that root's images")
    p.add_argument("--out-dir", type=Path, default=OUT)
    a = p.parse_args(argv)
    out = probe(a.data_root, a.store)
    path = a.out_dir / f"birds_attribute_probe_{a.data_root.name}_{a.store.name}.json"
    write_json(path, out, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
