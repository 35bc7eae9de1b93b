"""SynthBirds: Birds-to-Words, CUB-200-2011 (+ Reed captions) and NABirds, synthetic, in their released formats.

``generate(out, ...)`` writes::

    OUT/birds_to_words/birds-to-words-v1.0.tsv, images/<photo_id>.jpg    see idckit/data/birds_to_words.py
    OUT/CUB_200_2011/ (images/, images.txt, classes.txt, ...)             see idckit/data/cub.py
    OUT/cvpr2016_cub/text_c10/<class_dir>/<file>.txt + class lists
    OUT/nabirds/ (images/<class_id>/<hex>.jpg, images.txt, hierarchy.txt, ...)   see idckit/data/nabirds.py
    OUT/synth_birds.json   the taxonomy, every species' attributes and every photo's individual (the ground truth
                           that :func:`pair_animals` hands to ``bird_text.verified_share``)
    OUT/synth_info.json    {"synthetic": true, "generator", arguments, "counts"}: the kit's marker

All three datasets share one synthetic taxonomy (:mod:`bird_species`; 200 species by default, like CUB).
Birds-to-Words pairs follow the real pivot-branch scheme: a pivot photo (``base``) is paired with branch photos
chosen as ``visual`` (the most similar other species), ``sameSpecies``, ``sameGenus``, ``sameFamily``,
``sameOrder`` and ``sameClass`` (another order), three branches per pivot, all pairs of a pivot in one split
(80/10/10). Each pair gets 4-5 annotator paragraphs from :mod:`bird_text`'s grammar.

Every image is drawn from its own ``np.random.default_rng([seed, stream, index])`` individual and rendered by a
pure function, so the bytes do not depend on ``workers``; the directory is built under a temporary name and
renamed into place.
"""
from __future__ import annotations

import io
import json
import textwrap
import uuid
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from idckit.data.birds_to_words import COLUMNS, TSV_NAME, BirdsToWords
from idckit.data.synth import bird_text, writing
from idckit.data.synth.bird_render import render_bird
from idckit.data.synth.bird_species import Taxonomy, sample_individual, sample_taxonomy, visual_neighbour
from idckit.errors import DatasetError
from idckit.fileio import atomic_path

GENERATOR_VERSION = "synthbirds-1"
BRANCHES = ("visual", "sameSpecies", "sameGenus", "sameFamily", "sameOrder", "sameClass")
BRANCHES_PER_PIVOT = 3
SPLIT_FRACTIONS = {"train": 0.8, "val": 0.1, "test": 0.1}
FIRST_PHOTO_ID = 1000001
JPEG_QUALITY = 90
# rng streams: one per kind of draw, so adding one kind never shifts another
_PIVOT, _CUB, _NAB, _SPLIT, _CUBSPLIT, _NABSPLIT = 11, 21, 31, 41, 51, 61


def _branch_species(tax: Taxonomy, pivot, level: str, rng):
    sp = tax.species
    if level == "visual":
        return visual_neighbour(tax, pivot, rng)
    if level == "sameSpecies":
        return pivot
    rank = {"sameGenus": "genus", "sameFamily": "family", "sameOrder": "order"}.get(level)
    if rank is None:  # sameClass: another order
        cands = [s for s in sp if s.order != pivot.order]
    else:
        finer = {"genus": None, "family": "genus", "order": "family"}[rank]
        cands = [s for s in sp if getattr(s, rank) == getattr(pivot, rank) and s.species_id != pivot.species_id
                 and (finer is None or getattr(s, finer) != getattr(pivot, finer))]
    return cands[int(rng.integers(len(cands)))]


def animal(tax: Taxonomy, species_id: int, ind: dict) -> dict:
    """What the text may say about one photo: its species' attributes, species name, facing and background."""
    sp = tax.species[species_id]
    return {**sp.attrs, "species": sp.name, "facing": ind["facing"], "background": ind["background"]}


def plan_birds_to_words(tax: Taxonomy, n_pairs: int, seed: int) -> tuple[list[dict], dict[int, dict]]:
    """Pairs (with paragraphs) and photos (photo id -> species id and individual), deterministic per seed."""
    pairs: list[dict] = []
    photos: dict[int, dict] = {}
    n_pivots = -(-n_pairs // BRANCHES_PER_PIVOT)
    perm = np.random.default_rng([seed, _SPLIT]).permutation(n_pivots)
    n_val = max(1, round(n_pivots * SPLIT_FRACTIONS["val"]))
    n_test = max(1, round(n_pivots * SPLIT_FRACTIONS["test"]))
    split_of = {int(k): ("val" if r < n_val else "test" if r < n_val + n_test else "train")
                for r, k in enumerate(perm)}
    next_id = FIRST_PHOTO_ID
    for k in range(n_pivots):
        rng = np.random.default_rng([seed, _PIVOT, k])
        pivot = tax.species[int(rng.integers(len(tax.species)))]
        pid1 = next_id
        next_id += 1
        photos[pid1] = {"species_id": pivot.species_id, "individual": sample_individual(rng)}
        levels = [BRANCHES[int(i)] for i in rng.choice(len(BRANCHES), size=BRANCHES_PER_PIVOT, replace=False)]
        for level in levels:
            if len(pairs) == n_pairs:
                break
            other = _branch_species(tax, pivot, level, rng)
            pid2 = next_id
            next_id += 1
            photos[pid2] = {"species_id": other.species_id, "individual": sample_individual(rng)}
            a1 = animal(tax, pivot.species_id, photos[pid1]["individual"])
            a2 = animal(tax, other.species_id, photos[pid2]["individual"])
            n_ann = 5 if rng.random() < 0.8 else 4
            pairs.append({"img1": pid1, "img2": pid2, "selection": level, "split": split_of[k],
                          "paragraphs": [bird_text.describe_pair(a1, a2, rng) for _ in range(n_ann)]})
    return pairs, photos


def _obs_url(pid: int) -> str:
    return f"https://www.inaturalist.org/photos/{pid}"


def _img_url(pid: int) -> str:
    return f"https://static.inaturalist.org/photos/{pid}/medium.jpg?{1400000000 + (pid * 7919) % 10**8}"


def _tsv(tax: Taxonomy, pairs: list[dict]) -> str:
    lines = ["\t".join(COLUMNS)]
    for p in pairs:
        s1 = tax.species[p["sp1"]].name
        s2 = tax.species[p["sp2"]].name
        for n, text in enumerate(p["paragraphs"], start=1):
            lines.append("\t".join((_obs_url(p["img1"]), _img_url(p["img1"]), s1, "base",
                                    _obs_url(p["img2"]), _img_url(p["img2"]), s2, p["selection"],
                                    p["split"], str(n), text)))
    return "\n".join(lines) + "\n"


def class_dir(class_id: int, common: str) -> str:
    """CUB's ``001.Black_footed_Albatross`` form."""
    return f"{class_id:03d}." + common.replace(" ", "_").replace("-", "_")


def _jpeg(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=JPEG_QUALITY)
    return buf.getvalue()


def _render_job(job: tuple[str, dict, dict, int]) -> tuple[str, bytes, tuple]:
    rel, attrs, ind, size = job
    img, bbox = render_bird(attrs, ind, size)
    return rel, _jpeg(img), bbox


def generate(out: str | Path, *, n_pairs: int | None = None, cub_per_class: int | None = None,
             nabirds_per_class: int | None = None, size: int | None = None, seed: int | None = None,
             workers: int | None = None, tree: tuple[int, int, int, int] | None = None, profile: str | None = None,
             overwrite: bool = False, progress: bool = True, force: bool = False) -> Path:
    """Write SynthBirds to ``out`` (atomically); reuse it if it already holds the same arguments. ``force``: write
    beside entries the generator did not write (kept, never deleted). An argument left None is
    ``configs/synth_birds.json``'s at ``profile`` (None: the default profile).

    ``tree`` is (orders, families per order, genera per family, species per genus); the default gives 200 species.
    """
    a = writing.from_profile("synth_birds", profile, pairs=n_pairs, cub_per_class=cub_per_class,
                             nabirds_per_class=nabirds_per_class, size=size, seed=seed, workers=workers, tree=tree)
    n_pairs, cub_per_class, nabirds_per_class = a["pairs"], a["cub_per_class"], a["nabirds_per_class"]
    size, seed, workers, tree = a["size"], a["seed"], a["workers"], a["tree"]
    out = Path(out)
    if n_pairs < 30:
        raise DatasetError(f"--pairs {n_pairs} is too small", path=out,
                           fix="use at least 30 so that every split gets pivots")
    if cub_per_class < 2 or nabirds_per_class < 2:
        raise DatasetError("--cub-per-class and --nabirds-per-class must be at least 2", path=out,
                           fix="each class needs a training and a test image")
    if size < 48:
        raise DatasetError(f"--size {size} is too small to draw a bird", path=out, fix="use at least 48 (default 128)")
    out = writing.check_workers_seed_out(out, workers, seed)
    writing.check_pairs_fit(out, n_pairs)
    tree = tuple(int(v) for v in tree)
    if len(tree) != 4 or tree[0] < 2 or min(tree[1:]) < 2:
        raise DatasetError(f"tree {tree} cannot give every branch of the pivot-branch scheme", path=out,
                           fix="use at least 2 orders, 2 families per order, 2 genera per family, 2 species per genus")
    info = {"synthetic": True, "generator": GENERATOR_VERSION, "pairs": n_pairs, "cub_per_class": cub_per_class,
            "nabirds_per_class": nabirds_per_class, "size": size, "seed": seed, "tree": list(tree)}
    claim = writing.claim(out, "synth-birds", info, overwrite, force)
    if claim is None:
        return out

    tax = sample_taxonomy(seed, orders=tree[0], families=tree[1], genera=tree[2], species=tree[3])
    plans = {"birds_to_words": _plan_birds_to_words(tax, n_pairs, seed, size),
             "cub": _plan_cub(tax, cub_per_class, seed, size),
             "nabirds": _plan_nabirds(tax, nabirds_per_class, seed, size)}
    jobs = [job for plan in plans.values() for job in plan.jobs]

    boxes: dict[str, tuple] = {}
    with writing.staging(claim) as tmp:
        with get_context("fork").Pool(workers) if workers > 1 else _Serial() as pool:
            for rel, data, bbox in tqdm(pool.imap(_render_job, jobs, chunksize=8), total=len(jobs),
                                        desc="SynthBirds", unit="img", disable=not progress):
                path = tmp / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                boxes[rel] = bbox
        for plan in plans.values():
            plan.write(tmp, boxes)
        truth = {name: plan.truth for name, plan in plans.items()}
        truth["taxonomy"] = {"orders": tax.orders, "families": tax.families, "genera": tax.genera,
                             "species": [{"species_id": s.species_id, "name": s.name, "common": s.common,
                                          "order": s.order, "family": s.family, "genus": s.genus,
                                          "attrs": s.attrs} for s in tax.species]}
        (tmp / "synth_birds.json").write_text(json.dumps(truth, sort_keys=True), encoding="utf-8")
        counts = {**plans["birds_to_words"].counts, "species": len(tax.species),
                  "b2w_images": len(plans["birds_to_words"].jobs), "cub_images": len(plans["cub"].jobs),
                  "nabirds_images": len(plans["nabirds"].jobs)}
        (tmp / "synth_info.json").write_text(json.dumps({**info, "counts": counts}, sort_keys=True))
    return out


@dataclass
class _Plan:
    """One dataset's share of a generation: the images to draw (path under OUT, species attributes, individual,
    size), the ground truth, and ``write(tmp, boxes)`` for its text files once the images and boxes exist."""

    jobs: list[tuple[str, dict, dict, int]]
    truth: dict
    write: Callable[[Path, dict[str, tuple]], None]
    counts: dict = field(default_factory=dict)


def _plan_birds_to_words(tax: Taxonomy, n_pairs: int, seed: int, size: int) -> _Plan:
    pairs, photos = plan_birds_to_words(tax, n_pairs, seed)
    for p in pairs:
        p["sp1"], p["sp2"] = photos[p["img1"]]["species_id"], photos[p["img2"]]["species_id"]
    jobs = [(f"birds_to_words/images/{pid}.jpg", tax.species[ph["species_id"]].attrs, ph["individual"], size)
            for pid, ph in photos.items()]

    def write(tmp: Path, boxes: dict[str, tuple]) -> None:
        (tmp / "birds_to_words" / TSV_NAME).write_text(_tsv(tax, pairs), encoding="utf-8")

    counts = {s: {"pairs": sum(p["split"] == s for p in pairs),
                  "paragraphs": sum(len(p["paragraphs"]) for p in pairs if p["split"] == s)}
              for s in SPLIT_FRACTIONS}
    counts["selection"] = {b: sum(p["selection"] == b for p in pairs) for b in BRANCHES}
    return _Plan(jobs, {str(pid): ph for pid, ph in photos.items()}, write, counts)


def _plan_cub(tax: Taxonomy, per_class: int, seed: int, size: int) -> _Plan:
    """Class ids 1..S in species order, image ids 1..N, half of each class (rounded up) for training."""
    jobs, rows, truth = [], {"images": [], "labels": [], "split": []}, {}
    captions: dict[str, list[str]] = {}
    iid = 0
    for sp in tax.species:
        cdir = class_dir(sp.species_id + 1, sp.common)
        rng = np.random.default_rng([seed, _CUBSPLIT, sp.species_id])
        train = set(int(k) for k in rng.permutation(per_class)[: -(-per_class // 2)])
        for k in range(per_class):
            iid += 1
            rng = np.random.default_rng([seed, _CUB, iid])
            ind = sample_individual(rng)
            rel = f"{cdir}/{cdir.split('.', 1)[1]}_{k + 1:04d}_{iid}.jpg"
            jobs.append((f"CUB_200_2011/images/{rel}", sp.attrs, ind, size))
            rows["images"].append(f"{iid} {rel}")
            rows["labels"].append(f"{iid} {sp.species_id + 1}")
            rows["split"].append(f"{iid} {int(k in train)}")
            captions[rel] = bird_text.cub_captions(sp.attrs, rng)
            truth[str(iid)] = {"species_id": sp.species_id, "individual": ind}

    def write(tmp: Path, boxes: dict[str, tuple]) -> None:
        cub = tmp / "CUB_200_2011"
        _lines(cub / "images.txt", rows["images"])
        _lines(cub / "classes.txt", [f"{s.species_id + 1} {class_dir(s.species_id + 1, s.common)}"
                                     for s in tax.species])
        _lines(cub / "image_class_labels.txt", rows["labels"])
        _lines(cub / "train_test_split.txt", rows["split"])
        _lines(cub / "bounding_boxes.txt", [f"{row.split()[0]} " + " ".join(
            f"{v:.1f}" for v in boxes[f"CUB_200_2011/images/{row.split()[1]}"]) for row in rows["images"]])
        text = tmp / "cvpr2016_cub"
        for rel, caps in captions.items():
            p = text / "text_c10" / (rel.rsplit(".", 1)[0] + ".txt")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("\n".join(caps) + "\n", encoding="utf-8")
        # the caption release's zero-shot class lists: 3/4 trainval (of which 2/3 train), 1/4 test
        dirs = [class_dir(s.species_id + 1, s.common) for s in tax.species]
        zperm = [dirs[int(i)] for i in np.random.default_rng([seed, _SPLIT, 1]).permutation(len(dirs))]
        n_tv, n_tr = len(dirs) * 3 // 4, len(dirs) // 2
        for name, lst in (("allclasses", dirs), ("trainvalclasses", sorted(zperm[:n_tv])),
                          ("testclasses", sorted(zperm[n_tv:])), ("trainclasses", sorted(zperm[:n_tr])),
                          ("valclasses", sorted(zperm[n_tr:n_tv]))):
            _lines(text / f"{name}.txt", lst)

    return _Plan(jobs, truth, write)


def _plan_nabirds(tax: Taxonomy, per_class: int, seed: int, size: int) -> _Plan:
    """Node 0 is the root, then orders, families, genera and species; the species are the leaf classes."""
    names = ["Birds"]
    parent: list[tuple[int, int]] = []
    node: dict[tuple[str, int], int] = {}
    levels = (("order", [(n, None) for n in tax.orders], None), ("family", tax.families, "order"),
              ("genus", tax.genera, "family"), ("species", [(s.common, s.genus) for s in tax.species], "genus"))
    for level, members, up in levels:
        for k, (name, above) in enumerate(members):
            node[level, k] = len(names)
            parent.append((len(names), 0 if up is None else node[up, above]))
            names.append(name)
    jobs, rows, truth = [], {"images": [], "labels": [], "split": []}, {}
    uuid_of: dict[str, str] = {}
    k_img = 0
    for sp in tax.species:
        cid = node["species", sp.species_id]
        rng = np.random.default_rng([seed, _NABSPLIT, sp.species_id])
        train = set(int(k) for k in rng.permutation(per_class)[: -(-per_class // 2)])
        for k in range(per_class):
            rng = np.random.default_rng([seed, _NAB, k_img])
            k_img += 1
            u = str(uuid.UUID(bytes=rng.bytes(16), version=4))
            ind = sample_individual(rng)
            rel = f"{cid:04d}/{u.replace('-', '')}.jpg"
            jobs.append((f"nabirds/images/{rel}", sp.attrs, ind, size))
            rows["images"].append(f"{u} {rel}")
            rows["labels"].append(f"{u} {cid}")
            rows["split"].append(f"{u} {int(k in train)}")
            uuid_of[f"nabirds/images/{rel}"] = u
            truth[u] = {"species_id": sp.species_id, "individual": ind}

    def write(tmp: Path, boxes: dict[str, tuple]) -> None:
        nab = tmp / "nabirds"
        _lines(nab / "images.txt", rows["images"])
        _lines(nab / "classes.txt", [f"{i} {n}" for i, n in enumerate(names)])
        _lines(nab / "hierarchy.txt", [f"{c} {p}" for c, p in parent])
        _lines(nab / "image_class_labels.txt", rows["labels"])
        _lines(nab / "train_test_split.txt", rows["split"])
        _lines(nab / "sizes.txt", [f"{u} {size} {size}" for u in uuid_of.values()])
        _lines(nab / "bounding_boxes.txt", [f"{u} " + " ".join(str(int(round(v))) for v in boxes[rel])
                                            for rel, u in uuid_of.items()])

    return _Plan(jobs, truth, write)


def _lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


class _Serial:
    """Pool stand-in for workers=1 (same code path, no processes)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def imap(self, fn, jobs, chunksize=1):
        return map(fn, jobs)


# -- ground truth for evaluation ---------------------------------------------------------------------------
def load_truth(root: str | Path) -> dict:
    path = Path(root) / "synth_birds.json"
    if not path.is_file():
        raise DatasetError("no synth_birds.json: the attribute check needs SynthBirds' ground truth", path=path,
                           fix="generate the data with `idckit generate birds --out DIR` (real data has none)")
    return json.loads(path.read_text(encoding="utf-8"))


def pair_animals(root: str | Path, split: str) -> dict[str, tuple[dict, dict]]:
    """pair id (as :class:`idckit.data.birds_to_words.BirdsToWords` names it) -> (animal1, animal2) attributes,
    for ``bird_text.verified_share``. Swapped pairs (``..._swap``) are included, mirrored."""
    truth = load_truth(root)
    species = truth["taxonomy"]["species"]
    photos = truth["birds_to_words"]

    def one(pid: str) -> dict:
        ph = photos[pid]
        sp = species[ph["species_id"]]
        return {**sp["attrs"], "species": sp["name"], "facing": ph["individual"]["facing"],
                "background": ph["individual"]["background"]}

    out = {}
    for p in BirdsToWords(Path(root) / "birds_to_words").pairs(split):
        a1, a2 = one(p.img1.photo_id), one(p.img2.photo_id)
        out[p.pair_id] = (a1, a2)
        out[p.pair_id + "_swap"] = (a2, a1)
    return out


def sample_figure(root: str | Path, path: str | Path, *, n: int = 4, split: str = "test") -> Path:
    """Save ``n`` pairs of different selections with two of their paragraphs each (a PNG of a few hundred KB)."""
    # local: matplotlib costs 0.3 s at import; only this figure needs it, with Agg chosen before pyplot loads
    import matplotlib
    import matplotlib.pyplot as plt  # local: as matplotlib above

    matplotlib.use("Agg", force=False)
    ds = BirdsToWords(Path(root) / "birds_to_words")
    chosen, seen = [], set()
    for p in ds.pairs(split, only_with_images=True):
        if p.selection not in seen:
            seen.add(p.selection)
            chosen.append(p)
        if len(chosen) == n:
            break
    fig, axes = plt.subplots(len(chosen), 3, figsize=(11, 2.3 * len(chosen)),
                             gridspec_kw={"width_ratios": [1, 1, 2.6]}, squeeze=False)
    for row, p in zip(axes, chosen):
        for ax, ph, label in ((row[0], p.img1, "animal1"), (row[1], p.img2, "animal2")):
            with Image.open(ph.path) as im:
                ax.imshow(im.convert("RGB"))
            ax.set_title(f"{label}: {ph.species}", fontsize=8)
            ax.axis("off")
        text = "\n\n".join(textwrap.fill(r, 70) for r in p.references[:2])
        row[2].text(0.0, 0.5, f"[{p.selection}]\n{text}", fontsize=8, va="center", family="monospace")
        row[2].axis("off")
    fig.tight_layout()
    path = Path(path)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    buf.seek(0)
    with Image.open(buf) as im, atomic_path(path) as tmp:  # a 256-colour palette keeps the PNG small
        im.convert("RGB").quantize(256).save(tmp, format="PNG", optimize=True)
    return path
