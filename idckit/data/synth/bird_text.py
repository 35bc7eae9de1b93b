"""SynthBirds' text: a grammar of comparative sentences (Birds-to-Words style), its parser, and a truth check.

A sentence template such as ``{A} has {av} crown while {B} has {aw} crown`` means a list of statements
(``A crown_color = v``, ``B crown_color = w``). The same template is used both ways:

- to *write*: fill it from two birds' attributes, keeping only fillings whose statements are true, so every
  generated sentence is true by construction;
- to *read*: it compiles to a regular expression; :func:`parse_paragraph` turns any paragraph back into
  statements (sentences it cannot read are returned as such), and :func:`check_paragraph` checks each against the
  pair's attributes. :func:`verified_share` is the share of a captioner's statements that hold for its pairs,
  the "names attributes that really differ" measure, usable on generated paragraphs as well as on references;
  :func:`difference_recall` is its complement (how many of the real differences are named).

Text is lower-cased and pre-tokenised like Birds-to-Words: punctuation is its own token, ``'s`` is ``' s``,
sentences end with `` .``, the birds are the tokens ``animal1`` and ``animal2``.

Slots: ``{A}``/``{B}`` the two animals (always different); ``{v}``/``{w}`` a value word of the template's first /
second attribute; ``{av}``/``{aw}`` the same with its article for a singular part ("an olive"); ``{c}``/``{d}`` a
comparative word ("longer"); ``{ac}`` a comparative with its article.

CUB captions (:func:`cub_captions`) are plain single-image sentences in the style of Reed et al.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from idckit.data.synth.bird_species import BACKGROUNDS, CATEGORICAL, FACING, ORDINAL, SPECIES_ATTRS

ANIMALS = ("animal1", "animal2")

# attr -> (part nouns (synonyms), plural?)
PARTS: dict[str, tuple[tuple[str, ...], bool]] = {
    "crown_color": (("crown",), False), "nape_color": (("nape",), False), "breast_color": (("breast",), False),
    "belly_color": (("belly",), False), "wing_color": (("wings",), True), "beak_color": (("beak", "bill"), False),
    "leg_color": (("legs",), True), "breast_pattern": (("breast",), False), "wing_pattern": (("wings",), True),
    "tail_shape": (("tail",), False), "beak_shape": (("beak", "bill"), False),
    "tail_length": (("tail",), False), "beak_length": (("beak", "bill"), False),
    "beak_width": (("beak", "bill"), False), "leg_length": (("legs",), True),
}
# attr -> (words for "less", words for "more")
COMPARATIVES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "size": (("smaller",), ("larger", "bigger")),
    "body": (("slimmer", "more slender"), ("plumper", "stockier")),
    "tail_length": (("shorter",), ("longer",)),
    "beak_length": (("shorter",), ("longer",)),
    "beak_width": (("thinner",), ("thicker",)),
    "leg_length": (("shorter",), ("longer",)),
}
# attr -> {value: word}; default str(value)
WORDS: dict[str, dict] = {"background": {"sky": "the sky", "foliage": "green leaves", "water": "water"}}
VALUES: dict[str, tuple] = {**CATEGORICAL, "facing": FACING, "background": BACKGROUNDS}
COLOR_ATTRS = ("crown_color", "nape_color", "breast_color", "belly_color", "wing_color")
INDIVIDUAL_ATTRS = ("facing", "background")


@dataclass(frozen=True)
class Statement:
    subject: str  # "animal1", "animal2" or "both"
    attr: str  # an attribute name, or "species"
    op: str  # "=", "!=", ">", "<" (than the other animal), "same"
    value: object = None


@dataclass(frozen=True)
class Template:
    text: str
    attrs: tuple[str, ...]  # attr of {v}/{c} first, of {w}/{d} second
    stmts: tuple[tuple, ...]  # (subject slot "A"/"B"/"both", attr, op, value slot name or literal)
    plural: tuple[bool, ...] = (False, False)
    restrict: tuple = ()  # (slot, allowed values): a slot may only take these

    @property
    def regex(self) -> re.Pattern:
        return _compile(self)


def _word(attr: str, value) -> str:
    return WORDS.get(attr, {}).get(value, str(value))


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


@lru_cache(maxsize=None)
def _compile(t: Template) -> re.Pattern:
    def alt(words):
        return "(?:" + "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)) + ")"

    allowed = dict(t.restrict)
    pat = re.escape(t.text)
    subs = {"A": "(?P<A>animal1|animal2)", "B": "(?P<B>animal1|animal2)"}
    for k, (vs, cs, ac) in enumerate((("v", "c", "av"), ("w", "d", "aw"))):
        if k >= len(t.attrs):
            break
        attr = t.attrs[k]
        if attr in VALUES:
            words = [_word(attr, v) for v in allowed.get(vs, VALUES[attr])]
            subs[vs] = f"(?P<{vs}>{alt(words)})"
            subs[ac] = (f"(?P<{vs}>{alt(words)})" if t.plural[k] else f"(?:an?) (?P<{vs}>{alt(words)})")
        if attr in COMPARATIVES:
            words = [w for ws in COMPARATIVES[attr] for w in ws]
            subs[cs] = f"(?P<{cs}>{alt(words)})"
            if k == 0:
                subs["ac"] = (f"(?P<c>{alt(words)})" if t.plural[0] else f"(?:an?) (?P<c>{alt(words)})")
    for name, rx in subs.items():
        pat = pat.replace(re.escape("{" + name + "}"), rx)
    return re.compile(pat)


def _templates() -> list[Template]:
    T = Template
    out: list[Template] = []
    for attr, (nouns, plural) in PARTS.items():
        is_ = "are" if plural else "is"
        appear = "appear" if plural else "appears"
        pl = (plural, plural)
        for p in nouns:
            if attr in CATEGORICAL and attr not in ("eye_ring", "wing_bars"):
                one, two = (("A", attr, "=", "v"),), (("A", attr, "=", "v"), ("B", attr, "=", "w"))
                both = (("both", attr, "=", "v"),)
                out += [T(f"{{A}} has {{av}} {p}", (attr, attr), one, pl),
                        T(f"{{A}} ' s {p} {is_} {{v}}", (attr, attr), one, pl),
                        T(f"the {p} of {{A}} {is_} {{v}}", (attr, attr), one, pl),
                        T(f"{{A}} has {{av}} {p} while {{B}} has {{aw}} {p}", (attr, attr), two, pl),
                        T(f"{{A}} has {{av}} {p} and {{B}} has {{aw}} {p}", (attr, attr), two, pl),
                        T(f"{{A}} ' s {p} {is_} {{v}} but {{B}} ' s {p} {is_} {{w}}", (attr, attr), two, pl),
                        T(f"both animals have {{av}} {p}", (attr, attr), both, pl),
                        T(f"{{A}} and {{B}} both have {{av}} {p}", (attr, attr), both, pl)]
            if attr in COMPARATIVES:
                cmp = (("A", attr, "c", "c"),)
                out += [T(f"{{A}} has {{ac}} {p} than {{B}}", (attr,), cmp, pl),
                        T(f"{{A}} has {{ac}} {p}", (attr,), cmp, pl),
                        T(f"{{A}} ' s {p} {is_} {{c}} than {{B}} ' s", (attr,), cmp, pl),
                        T(f"{{A}} ' s {p} {appear} to be {{c}}", (attr,), cmp, pl)]
    for p in PARTS["beak_length"][0]:
        out.append(T(f"{{A}} has {{ac}} , {{d}} {p} than {{B}}", ("beak_length", "beak_width"),
                     (("A", "beak_length", "c", "c"), ("A", "beak_width", "c", "d"))))
    for attr in ("size", "body"):
        cmp = (("A", attr, "c", "c"),)
        out += [T("{A} is {c} than {B}", (attr,), cmp), T("{A} is {c}", (attr,), cmp),
                T("{A} looks {c} than {B}", (attr,), cmp), T("{A} appears to be {c}", (attr,), cmp)]
    # two colours of one animal in one sentence
    for a1 in COLOR_ATTRS:
        for a2 in COLOR_ATTRS:
            if a1 != a2:
                p1, pl1 = PARTS[a1][0][0], PARTS[a1][1]
                p2, pl2 = PARTS[a2][0][0], PARTS[a2][1]
                out.append(T(f"{{A}} has {{av}} {p1} and {{aw}} {p2}", (a1, a2),
                             (("A", a1, "=", "v"), ("A", a2, "=", "w")), (pl1, pl2)))
    ring = ("v", ("white", "yellow"))
    out += [T("{A} has {av} eye ring", ("eye_ring",), (("A", "eye_ring", "=", "v"),), restrict=(ring,)),
            T("{A} has an eye ring and {B} does not", ("eye_ring",),
              (("A", "eye_ring", "!=", "none"), ("B", "eye_ring", "=", "none"))),
            T("{A} has no eye ring", ("eye_ring",), (("A", "eye_ring", "=", "none"),)),
            T("{A} has {av} eye ring while {B} has none", ("eye_ring",),
              (("A", "eye_ring", "=", "v"), ("B", "eye_ring", "=", "none")), restrict=(ring,)),
            T("both animals have {av} eye ring", ("eye_ring",), (("both", "eye_ring", "=", "v"),), restrict=(ring,)),
            T("neither animal has an eye ring", ("eye_ring",), (("both", "eye_ring", "=", "none"),)),
            T("{A} has wing bars and {B} does not", ("wing_bars",),
              (("A", "wing_bars", "=", True), ("B", "wing_bars", "=", False))),
            T("{A} has wing bars", ("wing_bars",), (("A", "wing_bars", "=", True),)),
            T("{A} has no wing bars", ("wing_bars",), (("A", "wing_bars", "=", False),)),
            T("{A} lacks the wing bars of {B}", ("wing_bars",),
              (("A", "wing_bars", "=", False), ("B", "wing_bars", "=", True))),
            T("both animals have wing bars", ("wing_bars",), (("both", "wing_bars", "=", True),)),
            T("{A} is facing {v}", ("facing",), (("A", "facing", "=", "v"),)),
            T("{A} is facing {v} while {B} is facing {w}", ("facing", "facing"),
              (("A", "facing", "=", "v"), ("B", "facing", "=", "w"))),
            T("both animals are facing {v}", ("facing",), (("both", "facing", "=", "v"),)),
            T("{A} is photographed against {v}", ("background",), (("A", "background", "=", "v"),)),
            T("{A} is in front of {v} while {B} is in front of {w}", ("background", "background"),
              (("A", "background", "=", "v"), ("B", "background", "=", "w"))),
            T("both animals are photographed against {v}", ("background",), (("both", "background", "=", "v"),)),
            T("the two animals look the same", (), (("both", "species", "same", None),)),
            T("{A} and {B} look like the same species", (), (("both", "species", "same", None),))]
    return out


TEMPLATES: tuple[Template, ...] = tuple(_templates())


def _slot_value(template: Template, slot: str, word: str):
    """A matched word back to the attribute value (or, for a comparative slot, to '<' / '>')."""
    k = 0 if slot in ("v", "c") else 1
    attr = template.attrs[k]
    if slot in ("c", "d"):
        less, more = COMPARATIVES[attr]
        return "<" if word in less else ">"
    for value in VALUES[attr]:
        if _word(attr, value) == word:
            return value
    raise ValueError(word)


def _meaning(template: Template, fill: dict[str, object]) -> list[Statement]:
    out = []
    for subj, attr, op, val in template.stmts:
        subject = "both" if subj == "both" else fill[subj]
        if op == "c":
            out.append(Statement(subject, attr, fill[val]))
        elif isinstance(val, str) and val in ("v", "w"):
            out.append(Statement(subject, attr, op, fill[val]))
        else:
            out.append(Statement(subject, attr, op, val))
    return out


CLAUSE_JOINS = (" , and ", " ; ")
_JOIN_RE = re.compile("|".join(re.escape(j) for j in CLAUSE_JOINS))


def parse_sentence(sentence: str) -> list[Statement] | None:
    """The statements of one sentence (without its final `` .``), or None when no template reads it. A sentence
    of clauses joined by `` , and `` or `` ; `` is read clause by clause."""
    sentence = " ".join(sentence.split())
    whole = _parse_clause(sentence)
    if whole is not None or not any(j in sentence for j in CLAUSE_JOINS):
        return whole
    parts = [_parse_clause(c) for c in _JOIN_RE.split(sentence)]
    return None if any(p is None for p in parts) else [st for p in parts for st in p]


def _parse_clause(sentence: str) -> list[Statement] | None:
    for t in TEMPLATES:
        m = t.regex.fullmatch(sentence)
        if m is None:
            continue
        g = m.groupdict()
        if g.get("A") and g.get("B") and g["A"] == g["B"]:
            continue
        fill: dict[str, object] = {k: g[k] for k in ("A", "B") if g.get(k)}
        for slot in ("v", "w", "c", "d"):
            if g.get(slot) is not None:
                fill[slot] = _slot_value(t, slot, g[slot])
        return _meaning(t, fill)
    return None


def clauses(sentence: str) -> list[str]:
    """A sentence's clauses (the writer joins at most two observations with `` , and `` or `` ; ``)."""
    return _JOIN_RE.split(" ".join(sentence.split()))


def split_sentences(paragraph: str) -> list[str]:
    return [s.strip() for s in f" {paragraph} ".split(" . ") if s.strip() and s.strip() != "."]


def parse_paragraph(paragraph: str) -> tuple[list[Statement], list[str]]:
    """(statements, sentences no template reads)."""
    stmts, unread = [], []
    for s in split_sentences(paragraph.strip().removesuffix(" .").removesuffix(".")):
        parsed = parse_sentence(s)
        if parsed is None:
            unread.append(s)
        else:
            stmts.extend(parsed)
    return stmts, unread


def _index(attr: str, value):
    return ORDINAL[attr].index(value)


def holds(st: Statement, animal1: dict, animal2: dict) -> bool | None:
    """Is the statement true of the pair? None when the attribute is not known for both animals."""
    if st.op == "same":
        if "species" not in animal1 or "species" not in animal2:
            return None
        return animal1["species"] == animal2["species"]
    if st.attr not in animal1 or st.attr not in animal2:
        return None
    a, b = (animal1, animal2) if st.subject != "animal2" else (animal2, animal1)
    if st.op in (">", "<"):
        if st.attr not in ORDINAL or st.subject == "both":
            return False
        d = _index(st.attr, a[st.attr]) - _index(st.attr, b[st.attr])
        return d > 0 if st.op == ">" else d < 0
    if st.subject == "both":
        return a[st.attr] == st.value and b[st.attr] == st.value if st.op == "=" else \
            a[st.attr] != st.value and b[st.attr] != st.value
    return a[st.attr] == st.value if st.op == "=" else a[st.attr] != st.value


@dataclass(frozen=True)
class ParagraphCheck:
    statements: tuple[Statement, ...]
    verdicts: tuple[bool | None, ...]
    unread: tuple[str, ...]

    @property
    def n_true(self) -> int:
        return sum(v is True for v in self.verdicts)

    @property
    def n_claims(self) -> int:
        """Statements plus unreadable sentences: what a reader would have to take on trust."""
        return len(self.statements) + len(self.unread)


def check_paragraph(paragraph: str, animal1: dict, animal2: dict) -> ParagraphCheck:
    stmts, unread = parse_paragraph(paragraph)
    return ParagraphCheck(tuple(stmts), tuple(holds(s, animal1, animal2) for s in stmts), tuple(unread))


def verified_share(paragraphs: dict[str, str], animals: dict[str, tuple[dict, dict]]) -> float:
    """Share of all claims (parsed statements + unreadable sentences) in ``paragraphs`` (pair id -> text) that are
    verified true for the pair's ``animals`` (pair id -> (animal1 attrs, animal2 attrs)). 0.0 if there are none."""
    n_true = n = 0
    for pid, text in paragraphs.items():
        c = check_paragraph(text, *animals[pid])
        n_true += c.n_true
        n += c.n_claims
    return n_true / n if n else 0.0


def difference_recall(paragraphs: dict[str, str], animals: dict[str, tuple[dict, dict]]) -> float:
    """Share of the pairs' differing species attributes that some true statement about one animal names (pooled
    over pairs). The complement of :func:`verified_share`, which a captioner could keep high by saying little or
    only what both birds share. 0.0 if no pair differs in anything."""
    named = total = 0
    for pid, text in paragraphs.items():
        a1, a2 = animals[pid]
        diffs = {a for a in SPECIES_ATTRS if a in a1 and a in a2 and a1[a] != a2[a]}
        c = check_paragraph(text, a1, a2)
        said = {s.attr for s, v in zip(c.statements, c.verdicts) if v is True and s.subject != "both"}
        named += len(diffs & said)
        total += len(diffs)
    return named / total if total else 0.0


# -- writing ---------------------------------------------------------------------------------------------
_BY_ATTRS: dict[tuple[str, ...], list[Template]] = {}
for _t in TEMPLATES:
    _BY_ATTRS.setdefault(tuple(dict.fromkeys(_t.attrs)), []).append(_t)
MERGE_P = 0.45
SALIENCE = {"size": 3.0, "crown_color": 2.0, "breast_color": 2.0, "wing_color": 2.0, "beak_length": 2.0,
            "nape_color": 1.5, "belly_color": 1.5, "facing": 0.6, "background": 0.4}


def _fill(t: Template, first: str, pair: dict[str, dict]) -> dict | None:
    """Slot values that make every statement of ``t`` true with ``first`` as {A}; None if there are none."""
    other = ANIMALS[1 - ANIMALS.index(first)]
    fill: dict[str, object] = {"A": first, "B": other}
    for subj, attr, op, val in t.stmts:
        if attr not in pair[first] and attr != "species":
            return None
        who = pair[first] if subj in ("A", "both") else pair[other]
        if op == "c":
            if pair[first][attr] == pair[other][attr]:
                return None
            want = ">" if _index(attr, pair[first][attr]) > _index(attr, pair[other][attr]) else "<"
            if fill.setdefault(val, want) != want:
                return None
        elif isinstance(val, str) and val in ("v", "w"):
            if fill.setdefault(val, who[attr]) != who[attr]:
                return None
    for slot, allowed in t.restrict:
        if fill.get(slot) not in allowed:
            return None
    st = _meaning(t, fill)
    if not all(holds(s, pair["animal1"], pair["animal2"]) for s in st):
        return None
    return fill


def render(t: Template, fill: dict, rng) -> str:
    text = t.text
    for k, (vs, cs, ac) in enumerate((("v", "c", "av"), ("w", "d", "aw"))):
        if k >= len(t.attrs):
            break
        attr = t.attrs[k]
        if vs in fill:
            word = _word(attr, fill[vs])
            text = text.replace("{" + ac + "}", word if t.plural[k] else f"{_article(word)} {word}")
            text = text.replace("{" + vs + "}", word)
        if cs in fill:
            less, more = COMPARATIVES[attr]
            options = less if fill[cs] == "<" else more
            word = options[int(rng.integers(len(options)))]
            if k == 0:
                text = text.replace("{ac}", word if t.plural[0] else f"{_article(word)} {word}")
            text = text.replace("{" + cs + "}", word)
    return text.replace("{A}", str(fill["A"])).replace("{B}", str(fill["B"]))


def sentence_about(attrs: tuple[str, ...], pair: dict[str, dict], rng, *, shared: bool = False) -> str | None:
    """One true sentence about ``attrs`` (a difference, or with ``shared`` something both birds have)."""
    options = []
    for t in _BY_ATTRS.get(attrs, []):
        if shared != any(s[0] == "both" for s in t.stmts):
            continue
        for first in ANIMALS:
            f = _fill(t, first, pair)
            if f is not None:
                options.append((t, f))
    if not options:
        return None
    t, f = options[int(rng.integers(len(options)))]
    return render(t, f, rng)


def describe_pair(animal1: dict, animal2: dict, rng: np.random.Generator) -> str:
    """One annotator's paragraph: 2-5 differences (salient ones more often), sometimes a shared trait, some
    sentences joining two observations."""
    pair = {"animal1": animal1, "animal2": animal2}
    known = [a for a in animal1 if a in animal2 and a in _attr_set()]
    diffs = [a for a in known if animal1[a] != animal2[a]]
    same_kind = [a for a in known if animal1[a] == animal2[a] and (a,) in _BY_ATTRS]
    sentences: list[str] = []
    species_diffs = [a for a in diffs if a not in INDIVIDUAL_ATTRS]
    if not species_diffs and animal1.get("species") == animal2.get("species"):
        sentences.append(sentence_about((), pair, rng, shared=True))
    k = min(len(diffs), int(rng.integers(2, 6)))
    if k:
        w = np.array([SALIENCE.get(a, 1.0) for a in diffs])
        chosen = [diffs[int(i)] for i in rng.choice(len(diffs), size=k, replace=False, p=w / w.sum())]
        if "size" in chosen:
            chosen.remove("size")
            chosen.insert(0, "size")
        topics: list[tuple[str, ...]] = []
        while chosen:
            a = chosen.pop(0)
            if a in ("beak_length", "beak_width") and {"beak_length", "beak_width"} <= set(chosen + [a]) \
                    and rng.random() < 0.6:
                chosen.remove("beak_width" if a == "beak_length" else "beak_length")
                topics.append(("beak_length", "beak_width"))
            elif a in COLOR_ATTRS and any(c in COLOR_ATTRS for c in chosen) and rng.random() < 0.4:
                b = next(c for c in chosen if c in COLOR_ATTRS)
                chosen.remove(b)
                topics.append((a, b))
            else:
                topics.append((a,))
        for topic in topics:
            s = sentence_about(topic, pair, rng)
            if s is None and len(topic) > 1:  # no joint sentence fits: one sentence per attribute
                s = " . ".join(filter(None, (sentence_about((x,), pair, rng) for x in topic))) or None
            if s:
                sentences.append(s)
    if same_kind and (rng.random() < 0.35 or len(sentences) < 2):
        a = same_kind[int(rng.integers(len(same_kind)))]
        s = sentence_about((a,), pair, rng, shared=True)
        if s:
            sentences.append(s)
    sentences = [s for s in sentences if s]
    # annotators often run two observations into one sentence
    merged: list[str] = []
    for s in sentences:
        if merged and rng.random() < MERGE_P and not any(j in merged[-1] for j in CLAUSE_JOINS):
            merged[-1] = merged[-1] + CLAUSE_JOINS[int(rng.random() < 0.15)] + s
        else:
            merged.append(s)
    return " . ".join(merged) + " ."


@lru_cache(maxsize=1)
def _attr_set() -> frozenset[str]:
    return frozenset(a for key in _BY_ATTRS for a in key)


# -- CUB captions (single image, Reed et al. style) -------------------------------------------------------
_SIZE = {"small": "small", "medium": "medium sized", "large": "large"}
_CUB = (
    "this bird has a {crown_color} crown and a {beak_length} {beak_shape} bill",
    "a {size} bird with a {breast_color} breast, {wing_color} wings and a {tail_length} tail",
    "this {size} bird has a {belly_color} belly and {leg_color} legs",
    "this bird is mostly {wing_color} with a {nape_color} nape and a {beak_color} beak",
    "the bird has {wing_color} wings with {bars} and a {tail_shape} tail",
    "a {body} bird with a {breast_pattern} {breast_color} breast and a {crown_color} crown",
    "this bird has {ring} and a {crown_color} crown",
    "this is a {size} bird with {leg_length} {leg_color} legs and a {beak_color} bill",
    "this bird has a {crown_color} crown, a {nape_color} nape and {wing_pattern} {wing_color} wings",
    "a {size} {body} bird with a {beak_width} {beak_color} bill and a {belly_color} belly",
    "the breast of this bird is {breast_color} and the belly is {belly_color}",
    "this bird has a {tail_length} {tail_shape} tail and {wing_color} wings",
)


def cub_captions(attrs: dict, rng: np.random.Generator, n: int = 10) -> list[str]:
    """``n`` different single-image captions of a bird, lower-case and untokenised like the Reed captions."""
    words = {k: str(v) for k, v in attrs.items()}
    words["size"] = _SIZE[attrs["size"]]
    words["bars"] = "white wingbars" if attrs["wing_bars"] else "no wingbars"
    words["ring"] = "no eye ring" if attrs["eye_ring"] == "none" else f"a {attrs['eye_ring']} eye ring"
    order = rng.permutation(len(_CUB))[:n]
    out = []
    for k in order:
        text = _CUB[int(k)].format(**words)
        text = re.sub(r"\ba ([aeiou])", r"an \1", text)
        out.append(text + ("." if rng.random() < 0.5 else ""))
    return out
