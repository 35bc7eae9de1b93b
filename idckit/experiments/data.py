"""The dataset a notebook runs on: the real one when ``data_root`` is given, else the embedded synthetic default.

The synthetic default's size per profile is data (``configs/synth_clevr_change.json``,
``configs/synth_spot_the_diff.json``, ``configs/synth_editing_request.json``), like every other setting.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from idckit import paths, registry
from idckit.data.birds_to_words import BirdsToWords
from idckit.data.clevr_change import ClevrChange
from idckit.data.cub import Cub
from idckit.data.synth.vocab import GENERATOR_VERSION as CLEVR_GENERATOR_VERSION
from idckit.errors import ConfigError, DatasetError, IdckitError
from idckit.experiments.config import check_profile, load_config

#: files whose bytes say what a dataset holds: captions, splits, change types, class lists and indexes (every
#: kind's annotations are JSON, TSV or text); any other file (an image) enters a key by its name and size
ANNOTATION_SUFFIXES = (".json", ".jsonl", ".txt", ".tsv", ".csv")


def synth_settings(profile: str, hard: bool = False) -> dict:
    """The synthetic default of ``profile``; ``hard`` swaps in the faithful CLEVR-Change jitter (its ``hard`` key)."""
    s = load_config("synth_clevr_change", profile)
    hard_settings = s.pop("hard")
    return {**s, **hard_settings} if hard else s


def content_identity(root: str | Path) -> str:
    """What a dataset is, independent of where it lies: run keys and feature caches hold this, never the path, so
    moving or copying the data keeps every cached run, and editing it retrains. One function for every kind the kit
    reads (CLEVR-Change, Spot-the-Diff, Image-Editing-Request, the bird root).

    The SHA-256 of every file under ``root`` (links followed), by relative name: the bytes of its annotation files
    (:data:`ANNOTATION_SUFFIXES`; a synthetic set's ``synth_info.json`` as canonical JSON), and each other file's
    size. Sizes, not image bytes: reading every image would cost minutes on a real release (CLEVR-Change: about
    120,000 PNGs) at every notebook's setup, where a stat costs microseconds; and not modification times,
    which a plain copy changes. An image replaced in place by one of exactly the same size is not seen (a feature
    store also records its images' modification times, :func:`idckit.data.features.data_identity`). Names starting
    with a dot (the kit's lock, staging and owner files, an OS's own) and the top-level ``features/`` (where
    ``idckit features`` writes by default) are not the data and are skipped."""
    root = Path(root)
    h = hashlib.sha256()
    for rel, path in _data_files(root):
        h.update(rel.encode("utf-8", "surrogateescape") + b"\0")
        if rel == "synth_info.json":
            h.update(_synth_info(path).encode())
        elif path.suffix.lower() in ANNOTATION_SUFFIXES:
            h.update(_read(path))
        else:
            try:
                h.update(str(path.stat().st_size).encode())
            except FileNotFoundError:       # a dangling link: an image that is not there
                h.update(b"-")
        h.update(b"\0")
    synthetic = (root / "synth_info.json").is_file()
    return ("synth:" if synthetic else "index:") + h.hexdigest()[:16]


def _data_files(root: Path) -> list[tuple[str, Path]]:
    """(relative name, path) of every file under ``root`` that is data, sorted by name (links followed, each real
    folder entered once, so a link loop ends)."""
    out: list[tuple[str, Path]] = []
    seen: set[tuple[int, int]] = set()

    def walk(folder: Path, prefix: str) -> None:
        try:
            st = folder.stat()
            if (st.st_dev, st.st_ino) in seen:
                return
            seen.add((st.st_dev, st.st_ino))
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            raise DatasetError(f"cannot list this dataset folder ({e.strerror or e})", path=folder,
                               fix="make it readable (chmod -R u+rX), or point the data root elsewhere") from e
        for entry in entries:
            if entry.name.startswith(".") or (not prefix and entry.name == "features"):
                continue
            path, rel = Path(entry.path), prefix + entry.name
            if entry.is_dir():              # follows a link to a folder
                walk(path, rel + "/")
            else:
                out.append((rel, path))

    walk(root, "")
    return sorted(out)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise DatasetError(f"cannot read this dataset file ({e.strerror or e})", path=path,
                           fix="make it readable (chmod u+r), or point the data root elsewhere") from e


def _synth_info(path: Path) -> str:
    """A synthetic set's marker as canonical JSON: its layout and key order are not data."""
    try:
        meta = json.loads(_read(path).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"malformed synth_info.json ({e})", path=path,
                           fix="re-generate the dataset with `idckit generate ... --overwrite`") from e
    return json.dumps(meta, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class DataChoice:
    root: Path
    synthetic: bool
    description: str  # for report provenance
    version: str
    identity: str     # content_identity(root): what run keys and caches hold
    name: str = "clevr-change"  # a key of idckit.registry.DATASETS

    @property
    def tag(self) -> str:
        """The folder name of caches derived from this data: its identity alone, so moving or renaming the data
        keeps them."""
        return self.identity.replace(":", "-")

    def dataset(self):
        """The loader of this root: ``ClevrChange``, ``SpotTheDiff`` or ``EditingRequest`` (one interface)."""
        return loader(self.name)(self.root)


def loader(name: str):
    """The loader class of pair dataset ``name`` (:data:`idckit.registry.DATASETS`)."""
    d = registry.dataset(name)
    if not d.pairs:
        raise ConfigError(f"{name} is not a pair dataset; known: {', '.join(registry.pair_datasets())}",
                          fix=f"pass dataset= one of {', '.join(registry.pair_datasets())} (data_root in that "
                              "dataset's layout)")
    return registry.resolve(d.loader)


def clevr_change(profile: str, data_root: str | Path | None = None, *, hard: bool = False,
                 progress: bool = True) -> DataChoice:
    """The CLEVR-Change root to use; generates the synthetic default on first use (cached on disk).

    ``hard=True`` is the synthetic set at CLEVR-Change's own jitter, the setting the cpu budget does not learn
    (kept beside the learnable default so reports show what difficulty changes); it has no meaning for real data.
    """
    check_profile(profile)
    if data_root and hard:
        raise ConfigError("hard=True picks the faithful synthetic set; it cannot be combined with data_root",
                          fix="drop hard=True for real data (the real CLEVR-Change is the faithful setting)")
    if data_root:
        if not isinstance(data_root, (str, Path)):
            raise DatasetError(f"data_root must be a path (or None for the synthetic default), got {data_root!r}",
                               fix="pass the CLEVR-Change root directory as a string")
        root = Path(data_root).expanduser().resolve()
        ClevrChange(root)  # validates the layout now, with a helpful error
        info = root / "synth_info.json"
        if info.is_file():
            identity = content_identity(root)
            meta = json.loads(info.read_text())
            return DataChoice(root, True, f"synthetic: SynthCLEVR-Change at {root} ({meta.get('pairs')} pairs, "
                              f"{jitter_words(meta)})", meta.get("generator", "unknown"), identity)
        return DataChoice(root, False, f"real: CLEVR-Change at {root}", "official release", content_identity(root))
    s = synth_settings(profile, hard)
    w, h = s["size"]
    cam, lamp = float(s["camera_jitter"]), float(s["lamp_jitter"])
    root = synth_root(profile, hard)
    # local: the synthetic generators, the scene constants and NABirds' reader load numpy (~0.1 s), whose BLAS sizes
    # its thread pool when imported; `idckit reproduce`'s lane workers import this module before they set theirs
    from idckit.data.synth.clevr_change import generate  # renders only if not already there

    generate(root, n_pairs=s["pairs"], seed=s["seed"], size=(w, h), camera_jitter=cam, lamp_jitter=lamp,
             objects=tuple(s["objects"]), workers=s["workers"], progress=progress)
    return DataChoice(root, True, f"synthetic: SynthCLEVR-Change ({s['pairs']} before-images, seed {s['seed']}, "
                      f"{w}x{h}, {jitter_words(s)})", CLEVR_GENERATOR_VERSION, content_identity(root))


def synth_root(profile: str, hard: bool = False) -> Path:
    """Where the profile's synthetic default (or its hard twin) lives (generated there on first use)."""
    s = synth_settings(profile, hard)
    w, h = s["size"]
    cam, lamp = float(s["camera_jitter"]), float(s["lamp_jitter"])
    from idckit.data.synth.scene import MAX_OBJECTS, MIN_OBJECTS  # local: numpy, see clevr_change

    lo, hi = s["objects"]
    objects = "" if (lo, hi) == (MIN_OBJECTS, MAX_OBJECTS) else f"-obj{lo}-{hi}"   # CLEVR's 3-10: the old names
    return paths.data_dir() / f"synth-clevr-change-n{s['pairs']}-s{s['seed']}-{w}x{h}-cam{cam:g}-lamp{lamp:g}{objects}"


def jitter_words(info: dict) -> str:
    """How a synthetic set's difficulty reads in reports; sets written before the knobs existed used jitter 1.0
    and CLEVR's 3-10 objects (named only when they differ from it)."""
    from idckit.data.synth.scene import MAX_OBJECTS, MIN_OBJECTS  # local: numpy, see clevr_change

    cam, lamp = info.get("camera_jitter", 1.0), info.get("lamp_jitter", 1.0)
    lo, hi = info.get("objects", (MIN_OBJECTS, MAX_OBJECTS))
    objects = "" if (lo, hi) == (MIN_OBJECTS, MAX_OBJECTS) else f", {lo}-{hi} objects"
    return f"camera jitter {float(cam)}, lamp jitter {float(lamp)}{objects}"


def pair_dataset(name: str, profile: str, data_root: str | Path | None = None, *,
                 progress: bool = True) -> DataChoice:
    """The root of dataset ``name`` (a key of :data:`idckit.registry.DATASETS`) to use: ``data_root`` (real or
    synthetic, validated now), else the profile's synthetic default, generated on first use (cached on disk)."""
    load = loader(name)
    if name == "clevr-change":
        return clevr_change(profile, data_root, progress=progress)
    check_profile(profile)
    d = registry.dataset(name)
    if data_root:
        root = Path(data_root).expanduser().resolve()
        load(root)  # validates the layout now, with a helpful error
        identity = content_identity(root)
        info = root / "synth_info.json"
        if info.is_file():
            meta = json.loads(info.read_text())
            return DataChoice(root, True, f"synthetic: {d.synthetic} at {root} ({meta.get('pairs')} pairs)",
                              meta.get("generator", "unknown"), identity, name)
        return DataChoice(root, False, f"real: {d.title} at {root}", "official release", identity, name)
    s = load_config(d.config, profile)
    gen = registry.resolve(d.generator)
    # a generator's own difficulty knobs (SynthSpot-the-Diff's light_change) are the config's other keys
    knobs = {k: v for k, v in s.items() if k not in ("pairs", "seed", "workers")}
    root = paths.data_dir() / (f"synth-{name}-n{s['pairs']}-s{s['seed']}"
                               + "".join(f"-{k.split('_')[0]}{v:g}" for k, v in sorted(knobs.items()) if v != 1.0))
    # the kit's own cache: a set from an older generator version is replaced (never a folder without the marker)
    gen.generate(root, n_pairs=s["pairs"], seed=s["seed"], workers=s["workers"], overwrite=True,
                 progress=progress, **knobs)
    words = "".join(f", {k.replace('_', ' ')} {v:g}" for k, v in sorted(knobs.items()))
    return DataChoice(root, True, f"synthetic: {d.synthetic} ({s['pairs']} pairs, seed {s['seed']}{words})",
                      gen.GENERATOR_VERSION, content_identity(root), name)


# -- birds: Birds-to-Words, CUB-200-2011 and NABirds under one root ------------------------------------------
@dataclass(frozen=True)
class BirdsChoice:
    """A root holding ``birds_to_words/`` (TSV + ``images/``), ``CUB_200_2011/`` (+ the Reed captions beside it)
    and ``nabirds/``: SynthBirds' layout, and how the real downloads are to be arranged."""
    root: Path
    synthetic: bool
    description: str
    version: str
    identity: str     # content_identity(root): what run keys and caches hold, never the path

    @property
    def cache_name(self) -> str:
        """The folder name of caches derived from this data: its identity alone, so moving or renaming the data
        keeps them."""
        return self.identity.replace(":", "-")

    def b2w(self):
        return BirdsToWords(self.root / "birds_to_words")

    def cub(self):
        return Cub(self.root)

    def nabirds(self):
        from idckit.data.nabirds import NABirds  # local: numpy, see clevr_change

        return NABirds(self.root)

    def images(self) -> list[str]:
        """Every image the experiments read, relative to the root: Birds-to-Words photos that exist, CUB's
        training images (the GIC stage) and NABirds' training images (the FGVC stage)."""
        rel = lambda p: Path(p).resolve().relative_to(self.root).as_posix()
        out = [rel(ph.path) for ph in self.b2w().photos(only_ok=True)]
        out += [rel(im.path) for im in self.cub().images("train")]
        out += [rel(im.path) for im in self.nabirds().images("train")]
        return sorted(set(out))


#: the bird root's identity is every dataset's (:func:`content_identity`: the Birds-to-Words TSV, CUB's and NABirds'
#: lists, labels, splits and hierarchy, CUB's captions, every image); the name is kept for its callers
birds_identity = content_identity


def birds(profile: str, data_root: str | Path | None = None, *, progress: bool = True) -> BirdsChoice:
    """The bird root to use; generates the SynthBirds default of ``profile`` on first use (cached on disk)."""
    if data_root:
        root = Path(data_root).expanduser().resolve()
        choice = BirdsChoice(root, False, f"real: Birds-to-Words, CUB-200-2011 and NABirds at {root}",
                             "official release", "")
        choice.b2w(), choice.cub(), choice.nabirds()   # validates the layout now, with a helpful error
        identity = content_identity(root)
        info = root / "synth_info.json"
        if info.is_file():
            meta = json.loads(info.read_text())
            return BirdsChoice(root, True, f"synthetic: SynthBirds at {root} ({meta.get('pairs')} pairs)",
                               meta.get("generator", "unknown"), identity)
        return replace(choice, identity=identity)
    s = load_config("synth_birds", profile)
    tree = "x".join(str(t) for t in s["tree"])
    root = paths.data_dir() / (f"synth-birds-n{s['pairs']}-c{s['cub_per_class']}-b{s['nabirds_per_class']}"
                               f"-s{s['seed']}-{s['size']}px-t{tree}")
    from idckit.data.synth.birds import GENERATOR_VERSION, generate  # local: numpy, see clevr_change

    generate(root, n_pairs=s["pairs"], cub_per_class=s["cub_per_class"], nabirds_per_class=s["nabirds_per_class"],
             size=s["size"], seed=s["seed"], workers=s["workers"], tree=tuple(s["tree"]), progress=progress)
    root = root.resolve()
    return BirdsChoice(root, True, f"synthetic: SynthBirds ({s['pairs']} Birds-to-Words pairs, {s['cub_per_class']} "
                       f"CUB and {s['nabirds_per_class']} NABirds images per species, {s['size']} px, seed "
                       f"{s['seed']})", GENERATOR_VERSION, content_identity(root))


def check_root(dataset: str, root: str | Path) -> Path:
    """``root`` if it holds dataset ``dataset`` (a key of :data:`idckit.registry.DATASETS`) in its release's layout,
    else the kit's error naming the layout expected and the parameter, option and Makefile variable that take it.
    Nothing is generated or read beyond the layout's index files."""
    d = registry.dataset(dataset)
    path = Path(root).expanduser()
    try:
        if not path.is_dir():
            raise DatasetError("no such directory", path=path)
        if not d.pairs:     # the birds' root: three datasets, each checked by its own reader
            choice = BirdsChoice(path.resolve(), False, "", "", "")
            choice.b2w(), choice.cub(), choice.nabirds()
        else:
            loader(dataset)(path)
    except IdckitError as err:
        what = str(err).split("\n")[0]
        raise DatasetError(f"not a {d.title} root: {what}", path=err.path or path,
                           fix=f"point {d.param} / {d.option} / {d.variable}= at the folder holding {d.layout}; "
                               f"or leave it unset for {d.synthetic}") from err
    return path
