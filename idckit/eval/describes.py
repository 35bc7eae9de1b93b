"""Does a caption describe the change, or only say that something changed? A yardstick beside CIDEr-D.

For every changed CLEVR-Change pair, a caption is read with CLEVR-Change's own words (the template vocabulary of
:mod:`idckit.data.synth.vocab`: colours, materials, sizes, shapes and their synonyms, the add / drop / move
predicates and the "changed to / turned / became" verbs) and compared with the pair's change record:

- **change type named**: the caption's predicate names the record's type (colour / material / add / drop / move);
- **changed object named**: the noun phrase before the predicate names at least one attribute of the object, and
  every attribute it names is the changed object's (a colour or material change is referred to by its old value).

The record is the scene's own (SynthCLEVR-Change writes ``scenes/CLEVR_semantic_NNNNNN.json`` with the change and
``CLEVR_default_NNNNNN.json`` with the objects) or, on the real release, which ships no scenes, the pair's change
type (``type_mapping.json``) and the attributes its reference captions name (every reference describes the same
object). Chance rates: guessing the most common change type, and naming the changed object with the noun phrase
of another changed pair's reference.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from idckit.data.clevr_change import Pair
from idckit.data.synth.vocab import COLORS, MATERIALS, NO_CHANGE_SENTENCES, SHAPES, SIZES, SYNONYMS

ATTRIBUTES = ("size", "color", "material", "shape")
PREDICATES = {
    "add": ("has been added", "has been newly placed", "has appeared", "was added", "appeared", "new"),
    "drop": ("is missing", "is gone", "has disappeared", "is no longer there", "disappeared", "was removed",
             "has been removed"),
    "move": ("changed its location", "is in a different location", "moved", "has been moved", "was moved"),
}
CHANGE_VERBS = ("changed to", "turned", "became", "is now", "changed color to", "changed material to")
NO_CHANGE_MARKERS = ("no change", "no difference", "same", "identical", "nothing")

WORDS: dict[str, tuple[str, str]] = {}
for _v in SIZES:
    WORDS.update({w: ("size", _v) for w in SYNONYMS.get(_v, (_v,))})
for _v in COLORS:
    WORDS[_v] = ("color", _v)
for _v in MATERIALS:
    WORDS.update({w: ("material", _v) for w in SYNONYMS.get(_v, (_v,))})
for _v in SHAPES:
    if _v != "thing":
        WORDS.update({w: ("shape", _v) for w in SYNONYMS.get(_v, (_v,))})


@dataclass(frozen=True)
class Reading:
    change_type: str                 # color | material | add | drop | move | none | unknown
    attributes: dict                 # attribute -> value named in the noun phrase before the predicate
    value: str | None = None         # the new colour / material of a "changed to" caption


def read(caption: str) -> Reading:
    """The change type and the referent's attributes that ``caption`` names (unknown words are ignored)."""
    text = " ".join(re.sub(r"[^a-z ]", " ", caption.lower()).split())
    if text in NO_CHANGE_SENTENCES:
        return Reading("none", {})
    cut, ctype, value = None, "unknown", None
    for t, phrases in PREDICATES.items():
        for p in phrases:
            m = re.search(rf"\b{p}\b", text)
            if m and (cut is None or m.start() < cut):
                cut, ctype = m.start(), t
    for verb in CHANGE_VERBS:
        m = re.search(rf"\b{verb} (\w+)", text)
        if m and m.group(1) in WORDS and WORDS[m.group(1)][0] in ("color", "material") and \
                (cut is None or m.start() < cut):
            cut, ctype, value = m.start(), WORDS[m.group(1)][0], WORDS[m.group(1)][1]
    if ctype == "unknown":
        if any(re.search(rf"\b{m}\b", text) for m in NO_CHANGE_MARKERS):
            return Reading("none", {})
        return Reading("unknown", {})
    head = text[:cut].split()
    attrs: dict = {}
    for w in head:
        if w in WORDS:
            kind, v = WORDS[w]
            attrs.setdefault(kind, v)
            if kind == "shape":
                break   # the referent's noun ends its own description; what follows describes an anchor
    return Reading(ctype, attrs, value)


@dataclass(frozen=True)
class ChangeRecord:
    change_type: str
    obj: dict                        # attribute -> value of the changed object (as it was before, or as added)


def record_from_scene(semantic: Mapping, default: Mapping) -> ChangeRecord:
    ch = semantic["change"]
    obj = semantic["objects"][ch["after_index"]] if ch["type"] == "add" else default["objects"][ch["before_index"]]
    return ChangeRecord(ch["type"], {k: obj[k] for k in ATTRIBUTES if k in obj})


def record_from_references(pair: Pair) -> ChangeRecord:
    """The real release's record: its change type and the attributes its references agree on."""
    seen: dict[str, Counter] = {}
    for ref in pair.captions:
        for k, v in read(ref).attributes.items():
            seen.setdefault(k, Counter())[v] += 1
    return ChangeRecord(pair.change_type, {k: c.most_common(1)[0][0] for k, c in seen.items() if len(c) == 1})


def change_records(pairs: Sequence[Pair], root: str | Path | None = None) -> dict[str, ChangeRecord]:
    """``{pair id: record}`` of the changed pairs: from the scene files under ``root/scenes`` where they exist,
    else from the references."""
    scenes = Path(root) / "scenes" if root else None
    out = {}
    for p in pairs:
        if not p.is_change:
            continue
        sem = scenes / f"CLEVR_semantic_{p.index:06d}.json" if scenes else None
        if sem is not None and sem.is_file():
            default = scenes / f"CLEVR_default_{p.index:06d}.json"
            out[p.pair_id] = record_from_scene(json.loads(sem.read_text()), json.loads(default.read_text()))
        else:
            out[p.pair_id] = record_from_references(p)
    return out


def names_object(reading: Reading, record: ChangeRecord) -> bool:
    named = {k: v for k, v in reading.attributes.items() if k in record.obj}
    return bool(reading.attributes) and bool(named) and all(record.obj[k] == v for k, v in named.items())


def score(captions: Mapping[str, str], records: Mapping[str, ChangeRecord],
          references: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """Percent of the changed pairs (``records``) whose caption names the right change type
    (``type_named``) and the changed object (``attributes_named``), with their chance rates (the most common
    type's share; the next changed pair's first reference read against this pair's object: a well-formed
    description of another object)."""
    ids = sorted(k for k in records if k in captions)
    if not ids:
        raise ValueError("no captions for the changed pairs: nothing to score")
    readings = {k: read(captions[k]) for k in ids}
    types = Counter(records[k].change_type for k in ids)
    shifted = [names_object(read(references[ids[(i + 1) % len(ids)]][0]), records[k]) for i, k in enumerate(ids)]
    by_type = {t: [k for k in ids if records[k].change_type == t] for t in sorted(types)}
    return {"type_named": 100.0 * sum(readings[k].change_type == records[k].change_type for k in ids) / len(ids),
            "type_named_by_type": {t: 100.0 * sum(readings[k].change_type == t for k in ks) / len(ks)
                                   for t, ks in by_type.items()},
            "type_chance": 100.0 * types.most_common(1)[0][1] / len(ids),
            "attributes_named": 100.0 * sum(names_object(readings[k], records[k]) for k in ids) / len(ids),
            "attributes_chance": 100.0 * sum(shifted) / len(ids),
            "changed_pairs": len(ids)}


__all__ = ["Reading", "read", "ChangeRecord", "record_from_scene", "record_from_references", "change_records",
           "names_object", "score"]
