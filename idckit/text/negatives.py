"""FDA hard negatives for IDC-PCL: Retrieve, Replace and Confuse.

Follows the paper (Yao et al., AAAI 2022, s.2.2 "Fine-grained Difference Aligning" and appendix A.2, Tables
7-8): 6 negative captions per image pair, retrieve:replace:confuse = 2:2:2, Replace swaps the top 50 % (by
TF-IDF) of a caption's nouns and adjectives for random words of the same POS tag from vocabularies built on the
training captions (words with document frequency >= 10). The authors' public code never shipped this builder,
only pre-made ``{train,val}_neg_tfidf6.json`` files in the JSON-lines format ``NegativeSet.to_jsonl`` writes:
``{"img1", "img2", "sentences": [str], "neg_samples": [str x 6]}`` (all sentences of a pair share the negatives).

What the paper leaves open, and what this module does (each choice is a documented decision, not a recovered
fact):

* **TF-IDF.** Documents are the training captions (``vocab_captions``), terms their lower-cased tokens without
  punctuation; ``idf = ln((1 + N) / (1 + df)) + 1`` (the smoothed form of scikit-learn); words unseen in
  training get the largest idf. Written with numpy (+ torch for the blocked similarity products) because
  scipy and scikit-learn are not dependencies of the kit.
* **Retrieve.** A pair's query is the L2-normalised sum of its references' L2-normalised TF-IDF vectors. The
  candidates are the distinct captions of all pairs being built, ranked by cosine (ties: lexicographic
  order); any candidate in the pair's *forbidden set* (below) is skipped, which also makes every candidate a
  caption of an *other* pair.
* **Replace.** For each negative a reference of the pair is drawn (seeded; different references in turn). Its
  candidate words are the tokens tagged NN, NNS, JJ, JJR or JJS, except the referents ``animal1``/``animal2``
  (NNP) and the generic nouns in ``generic_words`` ("thing", "object", "bird", ...: swapping a generic noun
  in or out tends to give a *true* caption). Candidates are ranked by ``count-in-caption x idf`` (ties: the
  earlier position) and the top ``max(1, floor(top_fraction x n))`` are replaced: half, rounded down, but at
  least one so every caption with a candidate changes. Rounding down matches Table 7 better than rounding up
  on the change captions of a CLEVR-Change-like corpus built from the CLEVR-Change generator's caption grammar (2.7 of
  11.2 words, 24 %, vs 3.2, 29 %; the paper: 2.5 of 10.8, 23.4 %). Each chosen word is replaced by a
  uniformly random word of the *same tag* from that tag's vocabulary, never by itself or a synonym of itself
  (``synonyms``: CLEVR's cube/block, sphere/ball, large/big, small/tiny, metal/metallic/shiny, rubber/matte;
  gray/grey, color/colour), nor by a generic word. The
  vocabularies follow appendix A.2: tag every training caption, take the top-50 % candidates of each, and
  keep a (word, tag) if the word's document frequency is >= ``min_df`` (10).
* **Confuse.** Tried on each reference of the pair (seeded order), rules in this order:
  (A) *referent swap*: a caption containing ``animal1``/``animal2`` has every ``animal1`` and ``animal2``
  exchanged ("animal1 has a longer beak than animal2" -> "animal2 has a longer beak than animal1"; a
  multi-sentence description is swapped throughout); (B) *in-sentence NP swap* (first sentence): the
  sentence-initial subject NP is exchanged with the last NP before the main verb, i.e. the referent of a
  CLEVR relational expression ("the A that is left of the B changed to red" -> "the B that is left of the A
  changed to red"; "the other A the same color as the B ..." -> "the B the same color as the other A ...");
  requires the two NPs to differ after synonym folding; (C) *subject exchange between captions*: when (A)
  and (B) give too few, the pair's subject (everything before the main verb of its first sentence) is
  replaced by the subject of a caption of another pair, taken in Retrieve's similarity order, keeping this
  pair's predicate ("the small red cube has been added" + "the small red ball changed to blue" -> "the small
  red ball has been added"). (C) requires both subjects to start with an NP, to share at least one content
  word (so the negative stays hard), and each to have a content word the other lacks, after synonym folding
  (so the other subject is neither vaguer, "the red cube", nor a more specific description that could name
  the same object, "the small red metal cube left of the ball", for "the small red cube"). No-change
  sentences ("there is no change", "nothing has changed") have no such subject, so they get their confuse
  quota from the fallbacks below.
* **Forbidden set (never emitted for a pair).** Compared after whitespace normalisation, lower-casing and
  synonym folding (so "the tiny red block turned blue" is as forbidden as the reference "the small red cube
  turned blue"; paraphrases that differ in more than single-word synonyms, "is missing" / "has
  disappeared", are not recognised): the pair's own references; the references of every pair (in
  ``captions`` or ``vocab_captions``) that shares a reference with it (one hop: if two pairs are both
  correctly described by one sentence, their other references are treated as paraphrases too); and every
  *paraphrase class* containing one of its references
  (``paraphrase_classes``, by default the 9 interchangeable CLEVR-Change no-change sentences, so a no-change
  pair never gets a no-change sentence even when no other pair shares its sentences); plus negatives already
  chosen for the pair (no duplicates).
* **Fallbacks.** A strategy that cannot produce its quota is topped up from the strategies with a non-zero
  ratio in the order Retrieve (next-ranked captions), Replace (more random replacements), Confuse (more
  exchanges); ``stats["fallbacks"]`` counts the missing slots per strategy and ``stats["filled_by"]`` who
  filled them. A ratio of 0 switches a strategy off entirely (the CUB stage uses (3, 3, 0)-like ratios).
* **Determinism.** Pairs are processed in sorted id order, each with its own generator seeded from (seed,
  sha256(pair id)), and every set is iterated in sorted order, so the output does not depend on dict order.
  Results are cached under ``cache_dir`` keyed by a hash of every input and option and ``MODULE_VERSION``.

Known limits (inherent to the paper's recipe, not fixed here): a Retrieve negative can still be semantically
true (another scene's "the small gray matte cylinder is missing" for a pair described as "... has
disappeared"), a subject exchange can name the same object in other words ("the large cube" for "the red
cube"), and Replace on a no-change sentence gives odd or even true text ("there is no location", "no cube was
made"). Replace also picks JJ words like "left", "other" when the tagger calls them adjectives, as CoreNLP
would.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch
from tqdm import tqdm

from idckit import fileio
from idckit.data.synth.vocab import NO_CHANGE_SENTENCES, SYNONYMS
from idckit.errors import ConfigError, DatasetError
from idckit.text.pos import LexiconTagger, Tagger, get_tagger, resolve_tagger_name

MODULE_VERSION = "fda-negatives-1"
STRATEGIES: tuple[str, ...] = ("retrieve", "replace", "confuse")
REPLACE_TAGS = frozenset({"NN", "NNS", "JJ", "JJR", "JJS"})
NOUN_TAGS = frozenset({"NN", "NNS", "NNP", "NNPS"})
CONTENT_TAGS = NOUN_TAGS | {"JJ", "JJR", "JJS", "CD"}
VERB_TAGS = frozenset({"VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "MD"})
SENTENCE_END = frozenset({".", "!", "?"})

# Single-word synonym groups of the CLEVR-Change caption generator, plus spelling variants.
DEFAULT_SYNONYMS: tuple[tuple[str, ...], ...] = tuple(
    tuple(v for v in values if " " not in v) for values in SYNONYMS.values() if len(values) > 1
    and all(" " not in v for v in values)) + (("gray", "grey"), ("color", "colour"))
DEFAULT_PARAPHRASE_CLASSES: tuple[tuple[str, ...], ...] = (tuple(NO_CHANGE_SENTENCES),)
DEFAULT_REFERENTS: tuple[tuple[str, str], ...] = (("animal1", "animal2"),)
DEFAULT_GENERIC_WORDS: tuple[str, ...] = ("thing", "things", "object", "objects", "bird", "birds", "animal",
                                          "animals", "one", "ones")

def normalize(text: str) -> str:
    """Whitespace normalisation: the form in which negatives are emitted and compared."""
    return " ".join(str(text).split())


def _key(text: str) -> str:
    return normalize(text).lower()


_WORDY = re.compile(r"[^\W_]")


def _is_word(token: str) -> bool:
    """A token with a letter or digit (punctuation is not a TF-IDF term and never replaced)."""
    return _WORDY.search(token) is not None


def _stable_int(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")


# --------------------------------------------------------------------------------------------------------------
# TF-IDF
# --------------------------------------------------------------------------------------------------------------
class TfIdf:
    """Smoothed TF-IDF over a caption corpus (each caption one document), numpy only."""

    def __init__(self, documents: Iterable[str]):
        df: Counter[str] = Counter()
        n = 0
        for doc in documents:
            df.update({t for t in doc.lower().split() if _is_word(t)})
            n += 1
        self.n_docs = n
        self.df = df
        self.words = sorted(df)
        self.index = {w: i for i, w in enumerate(self.words)}
        counts = np.array([df[w] for w in self.words], dtype=np.float64)
        self.idf = np.log((1.0 + n) / (1.0 + counts)) + 1.0
        self.max_idf = math.log(1.0 + n) + 1.0  # what an unseen word (df = 0) would get

    def weight(self, word: str) -> float:
        i = self.index.get(word.lower())
        return self.max_idf if i is None else float(self.idf[i])

    def sparse(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(term indices, L2-normalised weights) of one text; unseen words are dropped."""
        counts = Counter(self.index[t] for t in text.lower().split() if t in self.index)
        if not counts:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        idx = np.fromiter(sorted(counts), np.int64, len(counts))
        val = np.array([counts[i] for i in idx], np.float64) * self.idf[idx]
        return idx, (val / np.linalg.norm(val)).astype(np.float32)


def _matrix(rows: Sequence[tuple[np.ndarray, np.ndarray]], n_cols: int):
    """Stack sparse rows as a torch matrix: dense when it fits in ~256 MB, else CSR."""
    n = len(rows)
    if n * n_cols <= 64_000_000:
        dense = np.zeros((n, n_cols), np.float32)
        for r, (idx, val) in enumerate(rows):
            dense[r, idx] = val
        return torch.from_numpy(dense)
    crow = np.zeros(n + 1, np.int64)
    crow[1:] = np.cumsum([len(idx) for idx, _ in rows])
    col = np.concatenate([idx for idx, _ in rows]) if n else np.zeros(0, np.int64)
    val = np.concatenate([v for _, v in rows]) if n else np.zeros(0, np.float32)
    return torch.sparse_csr_tensor(torch.from_numpy(crow), torch.from_numpy(col), torch.from_numpy(val),
                                   size=(n, n_cols))


# --------------------------------------------------------------------------------------------------------------
# Retrieve
# --------------------------------------------------------------------------------------------------------------
class Retrieve:
    """Ranks a pool of captions by TF-IDF cosine to a pair's references."""

    def __init__(self, tfidf: TfIdf, candidates: Sequence[str]):
        self.tfidf = tfidf
        self.candidates = list(candidates)  # normalised, distinct, sorted: the index order breaks ties
        self.matrix = _matrix([tfidf.sparse(c) for c in self.candidates], max(1, len(tfidf.words)))

    def query(self, references: Sequence[str]) -> np.ndarray:
        v = np.zeros(max(1, len(self.tfidf.words)), np.float32)
        for ref in sorted(references):
            idx, val = self.tfidf.sparse(ref)
            v[idx] += val
        norm = np.linalg.norm(v)
        return v / norm if norm > 0 else v

    def scores(self, queries: np.ndarray):
        """Cosine of each query row with every candidate: a (n_queries, n_candidates) torch tensor."""
        q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
        if self.matrix.layout == torch.sparse_csr:
            return (self.matrix @ q.T).T.contiguous()
        return q @ self.matrix.T

    def rank(self, references_per_query: Sequence[Sequence[str]], forbidden: Sequence[Iterable[int]],
             top: int | None, *, progress: bool = False, block: int = 256) -> list[np.ndarray]:
        """Candidate indices by decreasing cosine (ties: lower index first), forbidden ones removed, at most
        ``top`` per query (``None``: all)."""
        out: list[np.ndarray] = []
        n_cand = len(self.candidates)
        starts = range(0, len(references_per_query), block)
        for s in tqdm(starts, desc="FDA retrieve", unit="block", disable=not progress):
            refs = references_per_query[s:s + block]
            scores = self.scores(np.stack([self.query(r) for r in refs]))
            for r, forb in enumerate(forbidden[s:s + block]):
                forb = list(forb)
                if forb:
                    scores[r, forb] = -math.inf
            k = n_cand if top is None else min(n_cand, top)
            # Rounding to 6 decimals makes near-equal floats (summation order) tie exactly; ties then go to
            # the lower index, i.e. lexicographic order of the caption text.
            values, idx = torch.topk(scores, k, dim=1) if k < n_cand else torch.sort(scores, dim=1,
                                                                                    descending=True)
            values = np.round(values.numpy().astype(np.float64), 6)
            idx = idx.numpy()
            for r in range(len(refs)):
                keep = np.isfinite(values[r])
                v, i = values[r][keep], idx[r][keep]
                order = np.lexsort((i, -v))
                out.append(i[order])
        return out


# --------------------------------------------------------------------------------------------------------------
# Replace
# --------------------------------------------------------------------------------------------------------------
class Replace:
    """Replaces a caption's most important nouns and adjectives by random words of the same POS tag."""

    def __init__(self, tfidf: TfIdf, tags_of: Callable[[str], list[str]], train_captions: Iterable[str], *,
                 min_df: int = 10, top_fraction: float = 0.5, synonyms: Iterable[Iterable[str]] = (),
                 exclude: Iterable[str] = ()):
        self.tfidf = tfidf
        self.tags_of = tags_of
        self.top_fraction = top_fraction
        self.min_df = min_df
        self.canon: dict[str, str] = {}
        for group in synonyms:
            group = sorted(w.lower() for w in group)
            for w in group:
                self.canon[w] = group[0]
        self.exclude = {w.lower() for w in exclude}
        selected: dict[str, set[str]] = defaultdict(set)
        for caption in sorted(set(train_captions)):
            tokens = caption.split()
            tags = tags_of(caption)
            for i in self.targets(tokens, tags):
                selected[tags[i]].add(tokens[i].lower())
        # appendix A.2: the top-50 % words of every training sentence, kept if df >= min_df
        self.vocabularies: dict[str, list[str]] = {
            tag: sorted(w for w in words if tfidf.df.get(w, 0) >= min_df) for tag, words in selected.items()}
        self.vocabularies = {t: [w for w in ws if w not in self.exclude]
                             for t, ws in sorted(self.vocabularies.items())}
        self.vocabularies = {t: ws for t, ws in self.vocabularies.items() if ws}
        self._choices: dict[tuple[str, str], list[str]] = {}

    def n_targets(self, n_candidates: int) -> int:
        return max(1, math.floor(self.top_fraction * n_candidates + 1e-9)) if n_candidates else 0

    def targets(self, tokens: Sequence[str], tags: Sequence[str]) -> list[int]:
        """Positions to replace: the top fraction of the NN*/JJ* candidates by TF-IDF (ties: earlier first)."""
        lower = [t.lower() for t in tokens]
        counts = Counter(lower)
        cands = [i for i, (w, t) in enumerate(zip(lower, tags))
                 if t in REPLACE_TAGS and _is_word(w) and w not in self.exclude]
        cands.sort(key=lambda i: (-counts[lower[i]] * self.tfidf.weight(lower[i]), i))
        return sorted(cands[: self.n_targets(len(cands))])

    def _pool(self, tag: str, word: str) -> list[str]:
        key = (tag, word)
        pool = self._choices.get(key)
        if pool is None:
            c = self.canon.get(word, word)
            pool = self._choices[key] = [v for v in self.vocabularies.get(tag, ())
                                         if self.canon.get(v, v) != c and v not in self.exclude]
        return pool

    def replace(self, caption: str, rng: np.random.Generator) -> tuple[str, int] | None:
        """(new caption, words replaced), or None when no target has a replacement."""
        tokens = caption.split()
        tags = self.tags_of(caption)
        n = 0
        for i in self.targets(tokens, tags):
            pool = self._pool(tags[i], tokens[i].lower())
            if pool:
                tokens[i] = pool[int(rng.integers(len(pool)))]
                n += 1
        return (" ".join(tokens), n) if n else None


# --------------------------------------------------------------------------------------------------------------
# Confuse
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Parse:
    tokens: tuple[str, ...]
    end: int                            # end of the first sentence (exclusive)
    nps: tuple[tuple[int, int], ...]    # NP spans in the first sentence, before the main verb
    verb: int | None                    # index of the main verb of the first sentence


class Confuse:
    """Subject/object swaps within a caption and subject exchange between captions."""

    def __init__(self, tags_of: Callable[[str], list[str]], *, referents: Iterable[tuple[str, str]] = (),
                 synonyms: Iterable[Iterable[str]] = ()):
        self.tags_of = tags_of
        self.referents = [(a.lower(), b.lower()) for a, b in referents]
        self.canon: dict[str, str] = {}
        for group in synonyms:
            group = sorted(w.lower() for w in group)
            for w in group:
                self.canon[w] = group[0]
        self._parses: dict[str, _Parse] = {}
        self._subjects: dict[str, tuple[int, frozenset[str]] | None] = {}

    def parse(self, caption: str) -> _Parse:
        p = self._parses.get(caption)
        if p is not None:
            return p
        tokens = caption.split()
        tags = self.tags_of(caption)
        end = next((i + 1 for i, t in enumerate(tokens) if t in SENTENCE_END), len(tokens))
        # NP chunks: an optional determiner/possessive, then adjectives/nouns/numbers, ending on the last noun.
        nps: list[tuple[int, int]] = []
        i = 0
        while i < end:
            j = i + 1 if tags[i] in ("DT", "PRP$") else i
            last_noun = None
            while j < end and tags[j] in CONTENT_TAGS:
                if tags[j] in NOUN_TAGS:
                    last_noun = j
                j += 1
            if last_noun is not None:
                nps.append((i, last_noun + 1))
                i = last_noun + 1
            else:
                i += 1
        # Main verb: the first verb outside a relative clause; a clause opened by that/which/who closes at the
        # end of the next NP ("the A that is left of the B | became red").
        np_ends = {e - 1 for _, e in nps}
        verb = None
        in_relative = False
        for k in range(end):
            if tokens[k].lower() in ("that", "which", "who") and tags[k] in ("WDT", "WP"):
                in_relative = True
            elif tags[k] in VERB_TAGS and k > 0 and not in_relative:
                verb = k
                break
            if k in np_ends:
                in_relative = False
        nps_before = tuple(s for s in nps if verb is None or s[1] <= verb)
        p = self._parses[caption] = _Parse(tuple(tokens), end, nps_before, verb)
        return p

    def _content(self, tokens: Sequence[str], tags: Sequence[str]) -> frozenset[str]:
        return frozenset(self.canon.get(w.lower(), w.lower()) for w, t in zip(tokens, tags) if t in CONTENT_TAGS)

    def referent_swap(self, caption: str) -> str | None:
        tokens = caption.split()
        for a, b in self.referents:
            lower = [t.lower() for t in tokens]
            if a in lower or b in lower:
                swap = {a: b, b: a}
                return " ".join(swap.get(t.lower(), t) for t in tokens)
        return None

    def np_swap(self, caption: str) -> str | None:
        p = self.parse(caption)
        if p.verb is None or len(p.nps) < 2 or p.nps[0][0] != 0:
            return None
        (s0, s1), (o0, o1) = p.nps[0], p.nps[-1]
        tags = self.tags_of(caption)
        if self._content(p.tokens[s0:s1], tags[s0:s1]) == self._content(p.tokens[o0:o1], tags[o0:o1]):
            return None
        t = p.tokens
        return " ".join(t[o0:o1] + t[s1:o0] + t[s0:s1] + t[o1:])

    def in_sentence(self, caption: str) -> tuple[str, str] | None:
        """Rule A (referent swap), else rule B (NP swap): (negative, rule name) or None."""
        out = self.referent_swap(caption)
        if out is not None:
            return out, "referent_swap"
        out = self.np_swap(caption)
        return (out, "np_swap") if out is not None else None

    def subject(self, caption: str) -> tuple[int, frozenset[str]] | None:
        """(index of the main verb, content words of the subject), or None without an NP-initial subject."""
        if caption in self._subjects:
            return self._subjects[caption]
        p = self.parse(caption)
        out = None
        if p.verb is not None and p.nps and p.nps[0][0] == 0:
            out = p.verb, self._content(p.tokens[:p.verb], self.tags_of(caption)[:p.verb])
        self._subjects[caption] = out
        return out

    def exchange(self, caption: str, other: str) -> str | None:
        """Rule C: ``other``'s subject with ``caption``'s predicate, if the subjects overlap but differ."""
        mine, theirs = self.subject(caption), self.subject(other)
        if mine is None or theirs is None:
            return None
        (v_mine, c_mine), (v_theirs, c_theirs) = mine, theirs
        if not (c_mine & c_theirs) or not (c_theirs - c_mine) or not (c_mine - c_theirs):
            return None
        return " ".join(other.split()[:v_theirs] + caption.split()[v_mine:])


# --------------------------------------------------------------------------------------------------------------
# The negative set
# --------------------------------------------------------------------------------------------------------------
@dataclass
class NegativeSet:
    """``negatives[pair_id]``: exactly ``sum(ratio)`` strings; ``sources[pair_id]``: the strategy of each."""

    negatives: dict[str, list[str]]
    tagger: str
    stats: dict[str, Any]
    sources: dict[str, list[str]] = field(default_factory=dict)
    references: dict[str, list[str]] = field(default_factory=dict)

    def to_jsonl(self, path: str | Path, pairs_info: Mapping[str, Any]) -> Path:
        """Write the public code's ``*_neg_tfidf6.json`` format, one pair per line (sorted by pair id).

        ``pairs_info[pair_id]`` is ``(img1, img2)`` or a mapping with ``img1``, ``img2`` and optionally
        ``sentences`` (default: the references the negatives were built from)."""
        path = Path(path)
        missing = [pid for pid in self.negatives if pid not in pairs_info]
        if missing:
            raise DatasetError(f"pairs_info has no images for {len(missing)} pair(s), e.g. {missing[:3]}",
                               path=path, fix="pass img1/img2 for every pair of the negative set")
        lines = []
        for pid in sorted(self.negatives):
            info = pairs_info[pid]
            if isinstance(info, Mapping):
                img1, img2 = info["img1"], info["img2"]
                sentences = list(info.get("sentences") or self.references.get(pid, []))
            else:
                img1, img2 = info
                sentences = list(self.references.get(pid, []))
            lines.append(json.dumps({"img1": img1, "img2": img2, "sentences": sentences,
                                     "neg_samples": list(self.negatives[pid])}, ensure_ascii=False))
        fileio.write_text(path, "\n".join(lines) + "\n")
        return path

    @classmethod
    def from_jsonl(cls, path: str | Path, *, key: Callable[[dict], str] | None = None) -> "NegativeSet":
        """Read a ``*_neg_tfidf6.json`` file (the kit's or the authors'); pairs are keyed ``img1|img2``
        unless ``key`` says otherwise."""
        path = Path(path)
        if not path.is_file():
            raise DatasetError("negative file not found", path=path,
                               fix="build it with idckit.text.negatives.build_negatives(...).to_jsonl(...)")
        key = key or (lambda rec: f"{rec['img1']}|{rec['img2']}")
        negatives: dict[str, list[str]] = {}
        references: dict[str, list[str]] = {}
        width = None
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    pid, negs = key(rec), [str(s) for s in rec["neg_samples"]]
                    sentences = [str(s) for s in rec.get("sentences", [])]
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise DatasetError(f"line {lineno} is not a negative record ({exc})", path=path,
                                       fix="each line must be {img1, img2, sentences, neg_samples}") from exc
                if width is None:
                    width = len(negs)
                if len(negs) != width:
                    raise DatasetError(f"line {lineno} has {len(negs)} negatives, earlier lines {width}",
                                       path=path, fix="every record needs the same number of negatives")
                negatives[pid], references[pid] = negs, sentences
        return cls(negatives=negatives, tagger="unknown (read from file)", stats={"source": str(path)},
                   sources={pid: ["file"] * len(v) for pid, v in negatives.items()}, references=references)


# --------------------------------------------------------------------------------------------------------------
# build_negatives
# --------------------------------------------------------------------------------------------------------------
def _clean(captions: Mapping[str, Sequence[str]], what: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for pid, caps in captions.items():
        if isinstance(caps, str):
            raise DatasetError(f"{what}[{pid!r}] is a string; expected a list of captions",
                               fix="pass {pair_id: [caption, ...]}")
        refs = [normalize(c) for c in caps if normalize(c)]
        if str(pid) in out:
            raise DatasetError(f"two pair ids of {what} print as {str(pid)!r}", fix="use unique string ids")
        out[str(pid)] = refs
    return out


def _tagger_identity(tagger: str | Tagger) -> tuple[str, str]:
    if not isinstance(tagger, str):
        return tagger.name, getattr(tagger, "version", tagger.name)
    name = resolve_tagger_name(tagger)
    if name == "lexicon":
        return name, LexiconTagger.version
    return name, f"stanza-{metadata.version('stanza')}"


def build_negatives(
    captions: Mapping[str, Sequence[str]],
    *,
    vocab_captions: Mapping[str, Sequence[str]] | None = None,
    ratio: Sequence[int] = (2, 2, 2),
    seed: int = 0,
    tagger: str | Tagger = "auto",
    cache_dir: str | Path | None = None,
    negatives_for: Iterable[str] | None = None,
    min_df: int = 10,
    top_fraction: float = 0.5,
    synonyms: Iterable[Iterable[str]] = DEFAULT_SYNONYMS,
    paraphrase_classes: Iterable[Iterable[str]] = DEFAULT_PARAPHRASE_CLASSES,
    referents: Iterable[tuple[str, str]] = DEFAULT_REFERENTS,
    generic_words: Iterable[str] = DEFAULT_GENERIC_WORDS,
    progress: bool = True,
) -> NegativeSet:
    """Build ``sum(ratio)`` FDA negatives (retrieve, replace, confuse) for every pair of ``captions``.

    ``captions``: ``{pair_id: [reference, ...]}`` of the split being built; ``vocab_captions``: the training
    split, source of TF-IDF statistics and Replace vocabularies (default: ``captions``); ``negatives_for``:
    build only these pairs (all pairs stay in the retrieval pool). See the module docstring for every rule.
    """
    ratio = tuple(int(r) for r in ratio)
    if len(ratio) != 3 or min(ratio) < 0 or sum(ratio) == 0:
        raise ConfigError(f"ratio must be three non-negative counts (retrieve, replace, confuse) with a "
                          f"positive sum, got {ratio}", fix="e.g. ratio=(2, 2, 2), or (3, 3, 0) for CUB")
    if not 0 < top_fraction <= 1:
        raise ConfigError(f"top_fraction must be in (0, 1], got {top_fraction}")
    refs = _clean(captions, "captions")
    vocab_refs = refs if vocab_captions is None else _clean(vocab_captions, "vocab_captions")
    if not refs or not any(refs.values()):
        raise DatasetError("no captions to build negatives for", fix="pass {pair_id: [caption, ...]}")
    empty = [pid for pid, r in refs.items() if not r]
    targets = sorted(refs) if negatives_for is None else sorted({str(p) for p in negatives_for})
    unknown = [pid for pid in targets if pid not in refs]
    if unknown:
        raise ConfigError(f"negatives_for names {len(unknown)} pair(s) not in captions, e.g. {unknown[:3]}")
    bad = [pid for pid in targets if pid in empty]
    if bad:
        raise DatasetError(f"{len(bad)} pair(s) have no caption, e.g. {bad[:3]}",
                           fix="drop pairs without references or pass negatives_for")

    options = {
        "version": MODULE_VERSION, "ratio": list(ratio), "seed": int(seed), "min_df": int(min_df),
        "top_fraction": float(top_fraction),
        "synonyms": sorted(sorted(w.lower() for w in g) for g in synonyms),
        "paraphrase_classes": sorted(sorted(_key(s) for s in c) for c in paraphrase_classes),
        "referents": sorted([a.lower(), b.lower()] for a, b in referents),
        "generic_words": sorted(w.lower() for w in generic_words),
        "tagger": list(_tagger_identity(tagger)),
        "negatives_for": targets,
    }
    cache_file = None
    if cache_dir is not None:
        digest = hashlib.sha256()
        digest.update(json.dumps(options, sort_keys=True).encode())
        for name, mapping in (("captions", refs), ("vocab", None if vocab_captions is None else vocab_refs)):
            digest.update(name.encode())
            if mapping is not None:
                for pid in sorted(mapping):
                    digest.update(json.dumps([pid, sorted(mapping[pid])]).encode())
        cache_file = Path(cache_dir) / f"fda_negatives_{digest.hexdigest()[:24]}.json"
        if cache_file.is_file():
            try:
                cached = json.loads(cache_file.read_text(encoding="utf-8"))
                if cached.get("options") == options:
                    return NegativeSet(negatives=cached["negatives"], tagger=cached["tagger"],
                                       stats={**cached["stats"], "cache": "hit", "cache_file": str(cache_file)},
                                       sources=cached["sources"], references={p: refs[p] for p in targets})
            except (json.JSONDecodeError, KeyError):
                pass  # a damaged cache file is rebuilt below

    builder = _Builder(refs, vocab_refs, targets, ratio=ratio, seed=int(seed), tagger=tagger, min_df=min_df,
                       top_fraction=top_fraction, synonyms=options["synonyms"],
                       paraphrase_classes=options["paraphrase_classes"], referents=options["referents"],
                       generic_words=options["generic_words"], progress=progress)
    result = builder.build()
    if cache_file is not None:
        fileio.write_json(cache_file, {"options": options, "tagger": result.tagger, "stats": result.stats,
                                       "negatives": result.negatives, "sources": result.sources})
        result.stats = {**result.stats, "cache": "miss", "cache_file": str(cache_file)}
    return result


class _Builder:
    """One build's shared state (TF-IDF, POS tags, the candidate pool, every pair's forbidden set and retrieval
    ranking), then :meth:`build`: per pair, each strategy's quota from its generator, the documented fill order
    for what a strategy could not give, and the statistics."""

    def __init__(self, refs: dict[str, list[str]], vocab_refs: dict[str, list[str]], targets: list[str], *,
                 ratio: tuple[int, int, int], seed: int, tagger: str | Tagger, min_df: int, top_fraction: float,
                 synonyms, paraphrase_classes, referents, generic_words, progress: bool):
        self.t0 = time.perf_counter()
        self.refs, self.targets, self.ratio, self.seed, self.progress = refs, targets, ratio, seed, progress
        self.want = dict(zip(STRATEGIES, ratio))
        train_docs = [c for pid in sorted(vocab_refs) for c in vocab_refs[pid]]
        self.tfidf = TfIdf(train_docs)
        self.tagger = get_tagger(tagger, train_docs) if isinstance(tagger, str) else tagger
        self._tag_all(sorted(set(train_docs) | {c for r in refs.values() for c in r}))
        self.replacer = Replace(self.tfidf, self.tags_of, train_docs, min_df=min_df, top_fraction=top_fraction,
                                synonyms=synonyms, exclude=[*generic_words, *(w for pair in referents for w in pair)]) \
            if self.want["replace"] else None
        self.confuser = Confuse(self.tags_of, referents=[tuple(r) for r in referents], synonyms=synonyms) \
            if self.want["confuse"] else None
        # Comparison key: whitespace, case and synonyms folded, so "the tiny red block turned blue" counts as
        # equal to the reference "the small red cube turned blue" (it would be a true caption, not a negative).
        self.canon = {w: sorted(g)[0] for g in synonyms for w in g}
        self._forbidden(vocab_refs, paraphrase_classes)
        self._pool()
        self._rank()
        self.replaced_words: list[int] = []
        self.replaced_lengths: list[int] = []
        self.exchange_memo: dict[tuple[str, int], list[str]] = {}
        self.fallbacks, self.filled_by, self.produced, self.rules = Counter(), Counter(), Counter(), Counter()

    # -- shared state ---------------------------------------------------------------------------------------
    def _tag_all(self, texts: list[str]) -> None:
        """Tag every distinct caption once (stanza is much faster on batches)."""
        self.tag_cache: dict[str, list[str]] = {}
        for s in tqdm(range(0, len(texts), 4096), desc="FDA POS tagging",
                      disable=not self.progress or len(texts) < 20000):
            chunk = texts[s:s + 4096]
            for text, tags in zip(chunk, self.tagger.tag_many([c.split() for c in chunk])):
                self.tag_cache[text] = tags

    def tags_of(self, text: str) -> list[str]:
        tags = self.tag_cache.get(text)
        if tags is None:
            tags = self.tag_cache[text] = self.tagger.tag(text.split())
        return tags

    def key(self, text: str) -> str:
        return " ".join(self.canon.get(w, w) for w in normalize(text).lower().split())

    def _forbidden(self, vocab_refs: dict[str, list[str]], paraphrase_classes) -> None:
        """Forbidden sets: own references + references of pairs sharing one (one hop) + paraphrase classes."""
        neighbours: dict[str, set[str]] = defaultdict(set)
        for mapping in (self.refs, vocab_refs) if vocab_refs is not self.refs else (self.refs,):
            for r in mapping.values():
                keys = {self.key(c) for c in r}
                for k in keys:
                    neighbours[k] |= keys
        classes: dict[str, set[str]] = defaultdict(set)
        for cls in paraphrase_classes:
            keys = {self.key(k) for k in cls}
            for k in keys:
                classes[k] |= keys

        def forbidden_of(pid: str) -> set[str]:
            out: set[str] = set()
            for c in self.refs[pid]:
                k = self.key(c)
                out |= neighbours[k] | classes.get(k, set()) | {k}
            return out

        self.forbidden = {pid: forbidden_of(pid) for pid in self.targets}

    def _pool(self) -> None:
        pool_by_key: dict[str, str] = {}
        for pid in sorted(self.refs):
            for c in self.refs[pid]:
                k = self.key(c)
                pool_by_key[k] = min(pool_by_key.get(k, c), c)  # one text per key, independent of input order
        pool_keys = sorted(pool_by_key)
        self.pool_index = {k: i for i, k in enumerate(pool_keys)}
        self.pool_text = [pool_by_key[k] for k in pool_keys]

    def _forbidden_rows(self, pid: str) -> list[int]:
        return [self.pool_index[k] for k in sorted(self.forbidden[pid]) if k in self.pool_index]

    def _rank(self) -> None:
        """Retrieval rankings, deep enough for the quota, the fallbacks and rule C's partner search."""
        self.depth = 4 * sum(self.ratio) + 40
        self.rankings: dict[str, np.ndarray] = {}
        self.retriever = None
        if not (self.want["retrieve"] or self.want["confuse"]):
            return
        self.retriever = Retrieve(self.tfidf, self.pool_text)
        # Pairs with the same reference set (CLEVR's no-change pairs) share one ranking: rank each set once.
        groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
        for pid in self.targets:
            groups[tuple(sorted({self.key(c) for c in self.refs[pid]}))].append(pid)
        firsts = [members[0] for members in groups.values()]
        ranked = self.retriever.rank([self.refs[pid] for pid in firsts], [self._forbidden_rows(pid) for pid in firsts],
                                     self.depth, progress=self.progress and len(firsts) > 2000)
        self.rankings = {pid: ranking for members, ranking in zip(groups.values(), ranked) for pid in members}

    # -- per-pair generators (each yields candidate negatives; the caller filters forbidden ones) ------------
    def retrieve(self, pid: str, rng) -> Iterator[tuple[str, str]]:
        ranking = self.rankings[pid]
        for i in ranking:
            yield self.pool_text[i], "retrieve"
        if len(ranking) >= self.depth:    # the rare pair whose top-depth list runs out: every allowed candidate
            for i in self.retriever.rank([self.refs[pid]], [self._forbidden_rows(pid)], None)[0][len(ranking):]:
                yield self.pool_text[i], "retrieve"

    def _sources(self, pid: str, rng) -> list[str]:
        distinct = sorted(set(self.refs[pid]))
        return [distinct[i] for i in rng.permutation(len(distinct))]

    def replace(self, pid: str, rng) -> Iterator[tuple[str, str]]:
        srcs = self._sources(pid, rng)
        for attempt in range(12 * max(1, sum(self.ratio))):
            src = srcs[attempt % len(srcs)]
            out = self.replacer.replace(src, rng)
            if out is not None:
                yield out[0], f"replace:{out[1]}:{sum(_is_word(t) for t in src.split())}"

    def confuse(self, pid: str, rng) -> Iterator[tuple[str, str]]:
        srcs = self._sources(pid, rng)
        for src in srcs:
            out = self.confuser.in_sentence(src)
            if out is not None:
                yield out
        if self.retriever is None:
            return
        ranking = self.rankings[pid]
        for src in srcs:
            if self.confuser.subject(src) is None:
                continue
            # Pairs with the same references share the ranking object, so their exchanges are computed once.
            memo_key = (src, id(ranking))
            if memo_key not in self.exchange_memo:
                outs = (self.confuser.exchange(src, self.pool_text[i]) for i in ranking)
                self.exchange_memo[memo_key] = [o for o in outs if o is not None]
            for out in self.exchange_memo[memo_key]:
                yield out, "subject_exchange"

    # -- one pair, then all ----------------------------------------------------------------------------------
    def pair(self, pid: str) -> tuple[list[str], list[str]]:
        """(negatives, the strategy of each) for ``pid``: each strategy's quota, then the documented fill order."""
        rng = np.random.default_rng([self.seed, _stable_int(pid)])
        seen = set(self.forbidden[pid])
        chosen: list[str] = []
        chosen_src: list[str] = []
        gens = {"retrieve": self.retrieve, "replace": self.replace, "confuse": self.confuse}
        live = {s: gens[s](pid, rng) for s in STRATEGIES if self.want[s]}

        def take(strategy: str, n: int) -> int:
            got = 0
            gen = live[strategy]
            while got < n:
                item = next(gen, None)
                if item is None:
                    break
                text, how = item
                k = self.key(text)
                if k in seen:
                    continue
                seen.add(k)
                chosen.append(normalize(text))
                chosen_src.append(strategy)
                if how.startswith("replace:"):
                    _, n_rep, n_len = how.split(":")
                    self.replaced_words.append(int(n_rep))
                    self.replaced_lengths.append(int(n_len))
                elif strategy == "confuse":
                    self.rules[how] += 1
                got += 1
            return got

        total = sum(self.ratio)
        for s in STRATEGIES:
            if self.want[s]:
                got = take(s, self.want[s])
                self.produced[s] += got
                self.fallbacks[s] += self.want[s] - got
        for s in STRATEGIES:  # the documented fill order
            if self.want[s] and len(chosen) < total:
                got = take(s, total - len(chosen))
                self.filled_by[s] += got
                self.produced[s] += got
        if len(chosen) < total:
            raise DatasetError(
                f"pair {pid!r}: only {len(chosen)} of {total} distinct negatives could be built "
                f"(strategies {[s for s in STRATEGIES if self.want[s]]}); the corpus is too small or too uniform",
                fix="add captions, or enable retrieve in the ratio")
        return chosen, chosen_src

    def build(self) -> NegativeSet:
        negatives: dict[str, list[str]] = {}
        sources: dict[str, list[str]] = {}
        for pid in tqdm(self.targets, desc="FDA negatives", unit="pair",
                        disable=not self.progress or len(self.targets) < 2000):
            negatives[pid], sources[pid] = self.pair(pid)
        return NegativeSet(negatives=negatives, tagger=self.tagger.name, stats=self.stats(), sources=sources,
                           references={pid: self.refs[pid] for pid in self.targets})

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = {
            "pairs": len(self.targets),
            "ratio": dict(self.want),
            "per_strategy": {s: self.produced[s] for s in STRATEGIES},
            "fallbacks": {s: self.fallbacks[s] for s in STRATEGIES},
            "filled_by": {s: self.filled_by[s] for s in STRATEGIES},
            "confuse_rules": dict(sorted(self.rules.items())),
            "tagger": self.tagger.name,
            "tfidf_vocabulary": len(self.tfidf.words),
            "candidate_pool": len(self.pool_text),
            "seconds": round(time.perf_counter() - self.t0, 3),
        }
        if self.replacer is not None:
            n = len(self.replaced_words)
            stats["replace"] = {
                "negatives": n,
                "avg_replaced_words": sum(self.replaced_words) / n if n else 0.0,
                "avg_length": sum(self.replaced_lengths) / n if n else 0.0,
                "percent": 100.0 * sum(self.replaced_words) / max(1, sum(self.replaced_lengths)),
                "vocab_sizes": {t: len(ws) for t, ws in self.replacer.vocabularies.items()},
            }
        return stats
