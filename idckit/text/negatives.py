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
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

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
    import torch

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
        import torch

        q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
        if self.matrix.layout == torch.sparse_csr:
            return (self.matrix @ q.T).T.contiguous()
        return q @ self.matrix.T

    def rank(self, references_per_query: Sequence[Sequence[str]], forbidden: Sequence[Iterable[int]],
             top: int | None, *, progress: bool = False, block: int = 256) -> list[np.ndarray]:
        """Candidate indices by decreasing cosine (ties: lower index first), forbidden ones removed, at most
        ``top`` per query (``None``: all)."""
        import torch
        from tqdm import tqdm

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
    from importlib.metadata import version

    return name, f"stanza-{version('stanza')}"


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

    result = _compute(refs, vocab_refs, targets, ratio=ratio, seed=int(seed), tagger=tagger, min_df=min_df,
                      top_fraction=top_fraction, synonyms=options["synonyms"],
                      paraphrase_classes=options["paraphrase_classes"], referents=options["referents"],
                      generic_words=options["generic_words"], progress=progress)
    if cache_file is not None:
        fileio.write_json(cache_file, {"options": options, "tagger": result.tagger, "stats": result.stats,
                                       "negatives": result.negatives, "sources": result.sources})
        result.stats = {**result.stats, "cache": "miss", "cache_file": str(cache_file)}
    return result


def _compute(refs: dict[str, list[str]], vocab_refs: dict[str, list[str]], targets: list[str], *,
             ratio: tuple[int, int, int], seed: int, tagger: str | Tagger, min_df: int, top_fraction: float,
             synonyms, paraphrase_classes, referents, generic_words, progress: bool) -> NegativeSet:
    from tqdm import tqdm

    t0 = time.perf_counter()
    train_docs = [c for pid in sorted(vocab_refs) for c in vocab_refs[pid]]
    tfidf = TfIdf(train_docs)
    tagger_obj = get_tagger(tagger, train_docs) if isinstance(tagger, str) else tagger

    # Tag every distinct caption once (stanza is much faster on batches).
    to_tag = sorted(set(train_docs) | {c for r in refs.values() for c in r})
    tag_cache: dict[str, list[str]] = {}
    for s in tqdm(range(0, len(to_tag), 4096), desc="FDA POS tagging", disable=not progress or len(to_tag) < 20000):
        chunk = to_tag[s:s + 4096]
        for text, tags in zip(chunk, tagger_obj.tag_many([c.split() for c in chunk])):
            tag_cache[text] = tags

    def tags_of(text: str) -> list[str]:
        tags = tag_cache.get(text)
        if tags is None:
            tags = tag_cache[text] = tagger_obj.tag(text.split())
        return tags

    want = dict(zip(STRATEGIES, ratio))
    replacer = Replace(tfidf, tags_of, train_docs, min_df=min_df, top_fraction=top_fraction, synonyms=synonyms,
                       exclude=[*generic_words, *(w for pair in referents for w in pair)]) \
        if want["replace"] else None
    confuser = Confuse(tags_of, referents=[tuple(r) for r in referents], synonyms=synonyms) \
        if want["confuse"] else None

    # Comparison key: whitespace, case and synonyms folded, so "the tiny red block turned blue" counts as
    # equal to the reference "the small red cube turned blue" (it would be a true caption, not a negative).
    canon = {w: sorted(g)[0] for g in synonyms for w in g}

    def _key(text: str) -> str:
        return " ".join(canon.get(w, w) for w in normalize(text).lower().split())

    # Forbidden sets: own references + references of pairs sharing one (one hop) + paraphrase classes.
    neighbours: dict[str, set[str]] = defaultdict(set)
    for mapping in (refs, vocab_refs) if vocab_refs is not refs else (refs,):
        for r in mapping.values():
            keys = {_key(c) for c in r}
            for k in keys:
                neighbours[k] |= keys
    classes: dict[str, set[str]] = defaultdict(set)
    for cls in paraphrase_classes:
        keys = {_key(k) for k in cls}
        for k in keys:
            classes[k] |= keys

    def forbidden_of(pid: str) -> set[str]:
        out: set[str] = set()
        for c in refs[pid]:
            k = _key(c)
            out |= neighbours[k] | classes.get(k, set()) | {k}
        return out

    pool_by_key: dict[str, str] = {}
    for pid in sorted(refs):
        for c in refs[pid]:
            k = _key(c)
            pool_by_key[k] = min(pool_by_key.get(k, c), c)  # one text per key, independent of input order
    pool_keys = sorted(pool_by_key)
    pool_index = {k: i for i, k in enumerate(pool_keys)}
    pool_text = [pool_by_key[k] for k in pool_keys]
    forbidden = {pid: forbidden_of(pid) for pid in targets}

    # Retrieval ranking: deep enough for the quota, the fallbacks and rule C's partner search.
    need_ranking = bool(want["retrieve"] or want["confuse"])
    depth = 4 * sum(ratio) + 40
    rankings: dict[str, np.ndarray] = {}
    retriever = None
    if need_ranking:
        retriever = Retrieve(tfidf, pool_text)
        # Pairs with the same reference set (CLEVR's no-change pairs) share one ranking: rank each set once.
        groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
        for pid in targets:
            groups[tuple(sorted({_key(c) for c in refs[pid]}))].append(pid)
        firsts = [members[0] for members in groups.values()]
        ranked = retriever.rank([refs[pid] for pid in firsts],
                                [[pool_index[k] for k in sorted(forbidden[pid]) if k in pool_index]
                                 for pid in firsts], depth, progress=progress and len(firsts) > 2000)
        rankings = {pid: ranking for members, ranking in zip(groups.values(), ranked) for pid in members}

    def full_ranking(pid: str) -> np.ndarray:
        """All allowed candidates, for the rare pair whose top-``depth`` list runs out."""
        forb = [pool_index[k] for k in sorted(forbidden[pid]) if k in pool_index]
        return retriever.rank([refs[pid]], [forb], None)[0]

    # ---- per-pair generators (each yields candidate negatives; the caller filters forbidden ones) ----
    def gen_retrieve(pid: str, rng) -> Iterator[tuple[str, str]]:
        ranking = rankings[pid]
        for i in ranking:
            yield pool_text[i], "retrieve"
        if len(ranking) >= depth:
            for i in full_ranking(pid)[len(ranking):]:
                yield pool_text[i], "retrieve"

    def sources_of(pid: str, rng) -> list[str]:
        distinct = sorted(set(refs[pid]))
        return [distinct[i] for i in rng.permutation(len(distinct))]

    replaced_words: list[int] = []
    replaced_lengths: list[int] = []

    def gen_replace(pid: str, rng) -> Iterator[tuple[str, str]]:
        srcs = sources_of(pid, rng)
        for attempt in range(12 * max(1, sum(ratio))):
            src = srcs[attempt % len(srcs)]
            out = replacer.replace(src, rng)
            if out is not None:
                yield out[0], f"replace:{out[1]}:{sum(_is_word(t) for t in src.split())}"

    exchange_memo: dict[tuple[str, int], list[str]] = {}

    def gen_confuse(pid: str, rng) -> Iterator[tuple[str, str]]:
        srcs = sources_of(pid, rng)
        for src in srcs:
            out = confuser.in_sentence(src)
            if out is not None:
                yield out
        if retriever is None:
            return
        ranking = rankings[pid]
        for src in srcs:
            if confuser.subject(src) is None:
                continue
            # Pairs with the same references share the ranking object, so their exchanges are computed once.
            memo_key = (src, id(ranking))
            if memo_key not in exchange_memo:
                outs = (confuser.exchange(src, pool_text[i]) for i in ranking)
                exchange_memo[memo_key] = [o for o in outs if o is not None]
            for out in exchange_memo[memo_key]:
                yield out, "subject_exchange"

    gens = {"retrieve": gen_retrieve, "replace": gen_replace, "confuse": gen_confuse}
    negatives: dict[str, list[str]] = {}
    sources: dict[str, list[str]] = {}
    fallbacks = Counter()
    filled_by = Counter()
    produced = Counter()
    rules = Counter()
    total = sum(ratio)
    for pid in tqdm(targets, desc="FDA negatives", unit="pair", disable=not progress or len(targets) < 2000):
        rng = np.random.default_rng([seed, _stable_int(pid)])
        seen = set(forbidden[pid])
        chosen: list[str] = []
        chosen_src: list[str] = []
        live = {s: gens[s](pid, rng) for s in STRATEGIES if want[s]}

        def take(strategy: str, n: int) -> int:
            got = 0
            gen = live[strategy]
            while got < n:
                item = next(gen, None)
                if item is None:
                    break
                text, how = item
                k = _key(text)
                if k in seen:
                    continue
                seen.add(k)
                chosen.append(normalize(text))
                chosen_src.append(strategy)
                if how.startswith("replace:"):
                    _, n_rep, n_len = how.split(":")
                    replaced_words.append(int(n_rep))
                    replaced_lengths.append(int(n_len))
                elif strategy == "confuse":
                    rules[how] += 1
                got += 1
            return got

        for s in STRATEGIES:
            if want[s]:
                got = take(s, want[s])
                produced[s] += got
                fallbacks[s] += want[s] - got
        for s in STRATEGIES:  # the documented fill order
            if want[s] and len(chosen) < total:
                got = take(s, total - len(chosen))
                filled_by[s] += got
                produced[s] += got
        if len(chosen) < total:
            raise DatasetError(
                f"pair {pid!r}: only {len(chosen)} of {total} distinct negatives could be built "
                f"(strategies {[s for s in STRATEGIES if want[s]]}); the corpus is too small or too uniform",
                fix="add captions, or enable retrieve in the ratio")
        negatives[pid] = chosen
        sources[pid] = chosen_src

    stats: dict[str, Any] = {
        "pairs": len(targets),
        "ratio": dict(want),
        "per_strategy": {s: produced[s] for s in STRATEGIES},
        "fallbacks": {s: fallbacks[s] for s in STRATEGIES},
        "filled_by": {s: filled_by[s] for s in STRATEGIES},
        "confuse_rules": dict(sorted(rules.items())),
        "tagger": tagger_obj.name,
        "tfidf_vocabulary": len(tfidf.words),
        "candidate_pool": len(pool_text),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    if replacer is not None:
        n = len(replaced_words)
        stats["replace"] = {
            "negatives": n,
            "avg_replaced_words": sum(replaced_words) / n if n else 0.0,
            "avg_length": sum(replaced_lengths) / n if n else 0.0,
            "percent": 100.0 * sum(replaced_words) / max(1, sum(replaced_lengths)),
            "vocab_sizes": {t: len(ws) for t, ws in replacer.vocabularies.items()},
        }
    return NegativeSet(negatives=negatives, tagger=tagger_obj.name, stats=stats, sources=sources,
                       references={pid: refs[pid] for pid in targets})
