"""CLEVR-Change captions: referring expression + change predicate, and an independent parser that checks them.

Grammar (the CLEVR-Change generator's templates and synonyms, Seth-Park/clevr-dataset-gen ``cap_templates_pruned.json``,
``loc_templates_pruned.json``, ``synonyms.json``):

- referring expressions
  ``the <Z> <C> <M> <S>`` (any slot may be empty; an empty shape is ``thing``/``object``),
  ``the <Z2> <C2> <M2> <S2> [that is] <R> the <Z> <C> <M> <S>``,
  ``the other <Z2> <C2> <M2> <S2> that is the same size|color|shape as the <Z> <C> <M> <S>``,
  ``the other ... that is [made of] the same material as the ...``;
  bracketed words are dropped with p=0.5; synonyms from :mod:`idckit.data.synth.vocab`;
- predicates: color ``changed to|turned|became <colour>``; material ``changed to|turned|became
  rubber|matte|metallic|metal|shiny``; add ``has been added|has been newly placed|has appeared``; drop ``is
  missing|is gone|has disappeared|is no longer there``; move ``changed its location|is in a different location``.

A referent must denote exactly one object of the before scene (the after scene for ``add``) under CLEVR's
semantics: attribute filters, ``<R> the Y`` = the objects in ``relationships[R][Y]``, ``same <attr> as the Y`` =
the other objects sharing Y's attribute. :func:`parse_caption` and :func:`resolve` re-derive this from the
text alone, so the tests check every generated caption against its scenes instead of trusting the generator.

Left out: the three-hop chains and the ``both <R2> ... and <R> ...`` template (two-object anchors), which the
real data has but which add no new words or change types.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Sequence

import numpy as np

from idckit.data.synth.vocab import COLORS, MATERIALS, NO_CHANGE_SENTENCES, RELATIONS, SHAPES, SIZES, SYNONYMS

ATTRS = ("size", "color", "material")
_PREDICATES = {
    "add": ("has been added", "has been newly placed", "has appeared"),
    "drop": ("is missing", "is gone", "has disappeared", "is no longer there"),
    "move": ("changed its location", "is in a different location"),
}
_CHANGE_VERBS = ("changed to", "turned", "became")


class Unreferable(ValueError):
    """No expression of the grammar denotes this object alone (e.g. indistinguishable twins)."""


# -- word <-> canonical value -------------------------------------------------------------------------------
def _word(value: str, rng: np.random.Generator) -> str:
    choices = SYNONYMS.get(value, (value,))
    return choices[int(rng.integers(len(choices)))]


_CANON: dict[str, tuple[str, str]] = {}
for _v in SIZES:
    for _w in SYNONYMS[_v]:
        _CANON[_w] = ("size", _v)
for _v in COLORS:
    _CANON[_v] = ("color", _v)
for _v in MATERIALS:
    for _w in SYNONYMS[_v]:
        _CANON[_w] = ("material", _v)
_SHAPE_WORDS = {w: s for s in SHAPES for w in SYNONYMS[s]} | {"thing": None, "object": None}
_REL_PHRASES = sorted(((p.split(), r) for r in RELATIONS for p in SYNONYMS[r]), key=lambda x: -len(x[0]))


# -- generation ---------------------------------------------------------------------------------------------
def _matches(obj: dict, attrs: dict) -> bool:
    return all(obj[k] == v for k, v in attrs.items())


def _surface(attrs: dict, rng: np.random.Generator) -> str:
    words = [_word(attrs[k], rng) for k in ATTRS if k in attrs]
    words.append(_word(attrs["shape"], rng) if "shape" in attrs else _word("thing", rng))
    return " ".join(words)


def _attr_subsets(obj: dict, rng: np.random.Generator) -> list[dict]:
    keys = ("size", "color", "material", "shape")
    subsets = [dict((k, obj[k]) for k in c) for n in range(1, 5) for c in combinations(keys, n)]
    rng.shuffle(subsets)
    return subsets


def _plain(objs: list[dict], t: int, rng, pool: Sequence[int] | None = None) -> dict | None:
    pool = range(len(objs)) if pool is None else pool
    for attrs in _attr_subsets(objs[t], rng):
        if [i for i in pool if _matches(objs[i], attrs)] == [t]:
            return attrs
    return None


def _referring(scene: dict, t: int, rng: np.random.Generator) -> str | None:
    objs, rel = scene["objects"], scene["relationships"]
    kind = rng.choice(["plain", "relation", "same"], p=[0.4, 0.4, 0.2])
    order = {"plain": ["plain", "relation", "same"], "relation": ["relation", "plain", "same"],
             "same": ["same", "relation", "plain"]}[str(kind)]
    for k in order:
        if k == "plain":
            attrs = _plain(objs, t, rng)
            if attrs:
                return "the " + _surface(attrs, rng)
        elif k == "relation":
            options = [(r, a) for r in RELATIONS for a in range(len(objs)) if a != t and t in rel[r][a]]
            rng.shuffle(options)
            for r, a in options:
                anchor = _plain(objs, a, rng)
                target = _plain(objs, t, rng, pool=rel[r][a])
                if anchor and target:
                    that = "that is " if rng.random() < 0.5 else ""
                    return (f"the {_surface(target, rng)} {that}{_word(r, rng)} the {_surface(anchor, rng)}")
        else:
            options = [(attr, a) for attr in ("size", "color", "shape", "material") for a in range(len(objs))
                       if a != t and objs[a][attr] == objs[t][attr]]
            rng.shuffle(options)
            for attr, a in options:
                anchor = _plain(objs, a, rng)
                pool = [i for i in range(len(objs)) if i != a and objs[i][attr] == objs[a][attr]]
                target = _plain(objs, t, rng, pool=pool)
                if anchor and target:
                    if attr == "material":
                        made = "made of " if rng.random() < 0.5 else ""
                        clause = f"that is {made}the same material as"
                    else:
                        clause = f"that is the same {attr} as"
                    return f"the other {_surface(target, rng)} {clause} the {_surface(anchor, rng)}"
    return None


def _predicate(change: dict, rng: np.random.Generator) -> str:
    ctype = change["type"]
    if ctype in _PREDICATES:
        options = _PREDICATES[ctype]
        return options[int(rng.integers(len(options)))]
    verb = _CHANGE_VERBS[int(rng.integers(len(_CHANGE_VERBS)))]
    return f"{verb} {_word(change['attribute'], rng)}"


def change_captions(before: dict, after: dict, change: dict, rng: np.random.Generator, n: int) -> list[str]:
    """``n`` distinct true captions of the change (fewer only if the grammar cannot make ``n``).

    Raises :class:`Unreferable` when the changed object cannot be singled out at all.
    """
    scene, t = (after, change["after_index"]) if change["type"] == "add" else (before, change["before_index"])
    out: list[str] = []
    for _ in range(12 * n):
        ref = _referring(scene, t, rng)
        if ref is None:
            raise Unreferable(f"object {t} of image {scene.get('image_filename')} has no unique description")
        cap = f"{ref} {_predicate(change, rng)}"
        if cap not in out:
            out.append(cap)
        if len(out) == n:
            break
    return out


def no_change_captions(rng: np.random.Generator, n: int) -> list[str]:
    idx = rng.choice(len(NO_CHANGE_SENTENCES), size=min(n, len(NO_CHANGE_SENTENCES)), replace=False)
    return [NO_CHANGE_SENTENCES[int(i)] for i in idx]


def describe_scene(scene: dict) -> str:
    """``there is a large red metal cube , a small ... and a ...``: every object once, left to right."""
    objs = sorted(scene["objects"], key=lambda o: o["pixel_coords"][0])
    parts = [f"a {o['size']} {o['color']} {o['material']} {o['shape']}" for o in objs]
    body = parts[0] if len(parts) == 1 else " , ".join(parts[:-1]) + " and " + parts[-1]
    return "there is " + body


# -- parsing ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParsedCaption:
    referent: str | None
    change_type: str  # color | material | add | drop | move | none
    value: str | None


def parse_caption(caption: str) -> ParsedCaption:
    text = " ".join(caption.split())
    if text in NO_CHANGE_SENTENCES:
        return ParsedCaption(None, "none", None)
    for ctype, options in _PREDICATES.items():
        for p in options:
            if text.endswith(" " + p):
                return ParsedCaption(text[: -len(p) - 1], ctype, None)
    for verb in _CHANGE_VERBS:
        head, sep, word = text.rpartition(" ")
        if sep and head.endswith(" " + verb) and word in _CANON and _CANON[word][0] in ("color", "material"):
            kind, value = _CANON[word]
            return ParsedCaption(head[: -len(verb) - 1], kind, value)
    raise ValueError(f"not a CLEVR-Change caption (no known predicate): {caption!r}")


def _parse_np(toks: list[str], i: int) -> tuple[dict, int]:
    """``the [other] attrs noun [clause]`` -> ({attrs, shape, other, clause}, next index)."""
    if i >= len(toks) or toks[i] != "the":
        raise ValueError(f"expected 'the' at word {i} of {' '.join(toks)!r}")
    i += 1
    node: dict = {"attrs": {}, "other": False, "clause": None}
    if i < len(toks) and toks[i] == "other":
        node["other"], i = True, i + 1
    while i < len(toks) and toks[i] in _CANON:
        kind, value = _CANON[toks[i]]
        if kind in node["attrs"]:
            raise ValueError(f"two {kind} words in {' '.join(toks)!r}")
        node["attrs"][kind], i = value, i + 1
    if i >= len(toks) or toks[i] not in _SHAPE_WORDS:
        raise ValueError(f"expected a shape word at word {i} of {' '.join(toks)!r}")
    if _SHAPE_WORDS[toks[i]]:
        node["attrs"]["shape"] = _SHAPE_WORDS[toks[i]]
    i += 1
    if i == len(toks):
        return node, i
    j = i + 2 if toks[i: i + 2] == ["that", "is"] else i
    if toks[j: j + 3] == ["the", "same", "material"] or toks[j: j + 5] == ["made", "of", "the", "same", "material"]:
        j += 5 if toks[j] == "made" else 3
        attr = "material"
    elif toks[j: j + 2] == ["the", "same"] and j + 2 < len(toks) and toks[j + 2] in ("size", "color", "shape"):
        attr, j = toks[j + 2], j + 3
    else:
        attr = None
    if attr:
        if toks[j: j + 1] != ["as"]:
            raise ValueError(f"expected 'as' in {' '.join(toks)!r}")
        anchor, k = _parse_np(toks, j + 1)
        node["clause"] = ("same", attr, anchor)
        return node, k
    for words, rel in _REL_PHRASES:
        if toks[j: j + len(words)] == words:
            anchor, k = _parse_np(toks, j + len(words))
            node["clause"] = ("rel", rel, anchor)
            return node, k
    raise ValueError(f"unexpected words {' '.join(toks[i:])!r} in {' '.join(toks)!r}")


def _denote(node: dict, scene: dict) -> list[int]:
    objs = scene["objects"]
    cands = [i for i, o in enumerate(objs) if _matches(o, node["attrs"])]
    clause = node["clause"]
    if clause is None:
        return cands
    kind, arg, anchor_node = clause
    anchors = _denote(anchor_node, scene)
    keep: set[int] = set()
    for a in anchors:
        if kind == "rel":
            keep |= set(scene["relationships"][arg][a])
        else:
            keep |= {i for i, o in enumerate(objs) if i != a and o[arg] == objs[a][arg]}
    if node["other"]:
        keep -= set(anchors)
    return [i for i in cands if i in keep]


def resolve(referent: str, scene: dict) -> list[int]:
    """Indices of the objects of ``scene`` that the referring expression denotes."""
    toks = referent.split()
    node, end = _parse_np(toks, 0)
    if end != len(toks):
        raise ValueError(f"trailing words {' '.join(toks[end:])!r} in {referent!r}")
    return _denote(node, scene)
