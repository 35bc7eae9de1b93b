"""Caption metrics: BLEU-1..4, METEOR, ROUGE-L and CIDEr-D with pycocoevalcap 1.2, per-subset as RCC does.

What this follows
-----------------
* The scorers are pycocoevalcap 1.2's own classes (``Bleu(4)``, ``Meteor()``, ``Rouge()``, ``Cider()``) and its
  ``PTBTokenizer``, called the way ``COCOEvalCap.evaluate`` calls them (tokenise references and candidates, then
  score). ``COCOEvalCap.evaluate`` itself is never used: in 1.2 it always builds ``Spice()``, which downloads
  CoreNLP 3.6.0 and fails offline (``spice/get_stanford_models.py``). SPICE is therefore not reported.
* pycocoevalcap's "CIDEr" is CIDEr-D (clipping + Gaussian length penalty, sigma 6, x10) with document
  frequencies from the references being scored, so this module labels it ``CIDEr-D``.
* The CLEVR-Change breakdown follows RCC's ``utils/eval_utils.py``: total (sc + nsc), semantic (sc only), one
  subset per change type, distractor (nsc only), each scored as *its own corpus*. CIDEr-D's IDF is therefore
  recomputed per subset, exactly like RCC re-running COCOEvalCap with ``params['image_id']`` set to the subset.
* ``tokenize=False`` skips the PTB tokenizer and hands the strings to the scorers unchanged, which is what
  IDC-PCL's own ``eval/`` scripts do (yaolinli/IDC ``eval/eval.py``: copies of the same scorers, no tokenizer).
* Values are returned on pycocoevalcap's scale (BLEU/METEOR/ROUGE-L in 0-1, CIDEr-D as returned, e.g. 1.15);
  :func:`format_table` prints everything x100 as the papers do.

Deviations from calling pycocoevalcap naively (all no-ops on ordinary captions)
-------------------------------------------------------------------------------
* Line-break characters inside a caption (``\\r``, ``\\x0b``, ``\\x0c``, ``\\x1c-\\x1e``, ``\\x85``, U+2028, U+2029,
  i.e. whatever ``str.splitlines`` splits on) become spaces. pycocoevalcap only replaces ``\\n``; the Java
  tokenizer treats the others as line ends too, which silently shifts every later caption onto the wrong id,
  and a newline sent to the METEOR process desynchronises its line protocol (a hang).
* ``|||`` is removed from references before METEOR, as pycocoevalcap already does for the hypothesis (it is the
  protocol's field separator). Lone UTF-16 surrogates (possible from ``\\ud800`` JSON escapes) become ``?``
  instead of crashing the UTF-8 encoder.
* With ``meteor=False`` the ``METEOR`` key is absent (never a made-up number).

Checked behaviour (tests/test_eval_captions.py): an empty candidate scores 0 for that id and nothing breaks;
accented letters ("cafe" with an acute e) pass through PTB and METEOR unchanged; an emoji is dropped by the PTB
tokenizer (it logs "Untokenizable") and ignored by METEOR's tokenizer. Both jars read UTF-8 whatever the locale.
"""
from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Mapping, Sequence

from tqdm.auto import tqdm

from idckit import fileio
from idckit.data.clevr_change import CHANGE_TYPES, DISTRACTOR
from idckit.data.detect import open_dataset
from idckit.errors import MissingDependencyError, ResultsError

METRICS: tuple[str, ...] = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr-D")
SUBSET_ORDER: tuple[str, ...] = ("total", "semantic", *CHANGE_TYPES, DISTRACTOR)
RESULT_FILES = ("sc_results.json", "nsc_results.json")
JAVA_FIX = "install a Java runtime: apt-get install -y default-jre-headless (or pass tokenize=False / meteor=False, " \
           "--no-tokenize / --no-meteor, to skip the Java parts)"
RESULTS_FIX = ('an RCC result file is a JSON list of {"image_id": "000123.png", "caption": "..."}; a results '
               "directory holds sc_results.json (ids 000123.png) and nsc_results.json (ids 000123.png_n); "
               "write them with idckit.eval.captions.write_results")


# -- text hygiene ------------------------------------------------------------------------------------------
def _clean(text: str) -> str:
    # splitlines() knows every character Java's tokenizer also ends a line on; see the module docstring.
    text = " ".join(text.splitlines())
    return text.encode("utf-8", "replace").decode("utf-8")


def _require_java(what: str) -> None:
    if shutil.which("java") is None:
        raise MissingDependencyError(f"`java` is not on PATH; {what} needs a Java runtime", fix=JAVA_FIX)


# -- the scorer ------------------------------------------------------------------------------------------
class CaptionScorer:
    """pycocoevalcap's scorers, with ONE METEOR subprocess reused across :meth:`score` calls.

    Use as a context manager (``with CaptionScorer() as s: s.score(refs, cands)``); the METEOR JVM (about 2 GB,
    ~8-15 s to load its paraphrase table) starts in the constructor so it loads while the tokenizer runs, and is
    stopped by :meth:`close`. ``meteor=False`` never starts Java. The PTB tokenizer is a short-lived JVM per call
    (pycocoevalcap's design; ~0.5 s) and needs Java too.
    """

    def __init__(self, meteor: bool = True):
        # local: the training tasks import this module and may not import pycocoevalcap (test_import_hygiene)
        from pycocoevalcap.bleu.bleu import Bleu
        from pycocoevalcap.cider.cider import Cider  # local: as Bleu
        from pycocoevalcap.rouge.rouge import Rouge  # local: as Bleu

        self._bleu, self._rouge, self._cider = Bleu(4), Rouge(), Cider()
        self._meteor = None
        if meteor:
            _require_java("METEOR")
            from pycocoevalcap.meteor.meteor import Meteor  # local: pycocoevalcap is off the training path

            self._meteor = Meteor()

    @property
    def has_meteor(self) -> bool:
        return self._meteor is not None

    def __enter__(self) -> "CaptionScorer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the METEOR process. Safe to call twice."""
        m, self._meteor = self._meteor, None
        if m is None:
            return
        # Not m.__del__(): it takes m.lock, which pycocoevalcap leaves held if compute_score raised, so it
        # would deadlock. A fresh lock keeps its later __del__ (at garbage collection) harmless.
        p = m.meteor_p
        try:
            p.stdin.close()
        except OSError:
            pass
        p.kill()
        p.wait()
        for stream in (p.stdout, p.stderr):
            stream.close()
        m.lock = threading.Lock()

    # -- steps -------------------------------------------------------------------------------------------
    def tokenize(self, captions: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
        """PTB-tokenise ``{id: [caption, ...]}`` exactly as COCOEvalCap does (lower-case, punctuation dropped)."""
        _require_java("the PTB tokenizer")
        # local: pycocoevalcap is off the training path (tests/test_import_hygiene.py)
        from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

        ids = sorted(captions)
        out = PTBTokenizer().tokenize({k: [{"caption": _clean(c)} for c in captions[k]] for k in ids})
        # PTBTokenizer zips ids with output lines; a mismatch would silently score captions against wrong ids.
        for k in ids:
            if len(out.get(k, ())) != len(captions[k]):
                raise RuntimeError(f"PTB tokenizer output is misaligned at id {k!r}: expected {len(captions[k])} "
                                   f"lines, got {len(out.get(k, ()))}; please report this caption text")
        return out

    def _prepare(self, references: Mapping[str, Sequence[str]], candidates: Mapping[str, str],
                 tokenize: bool) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """Validate, then return pycocoevalcap's ``gts``/``res`` dicts (``{id: [str]}``) over the candidate ids."""
        if not candidates:
            raise ResultsError("no candidate captions to score",
                               fix="pass at least one {id: caption}")
        for k, c in candidates.items():
            if not isinstance(c, str):
                raise ResultsError(f"candidate for id {k!r} is {type(c).__name__}, not a string",
                                   fix="give exactly one caption string per id")
            refs = references.get(k)
            if not refs:
                raise ResultsError(f"candidate id {k!r} has no reference captions",
                                   fix="score only ids that are in the references (check the split and the "
                                       "id format, e.g. '000123.png' / '000123.png_n')")
            if isinstance(refs, str) or not all(isinstance(r, str) for r in refs):
                raise ResultsError(f"references for id {k!r} must be a list of strings",
                                   fix="pass {id: [reference, ...]}")
        gts = {k: [_clean(r) for r in references[k]] for k in sorted(candidates)}
        res = {k: [_clean(candidates[k])] for k in sorted(candidates)}
        if tokenize:
            gts, res = self.tokenize(gts), self.tokenize(res)
        return gts, res

    def _score_prepared(self, gts: dict[str, list[str]], res: dict[str, list[str]], meteor: bool) -> dict[str, float]:
        bleu, _ = self._bleu.compute_score(gts, res, verbose=0)
        out = {f"Bleu_{n + 1}": float(b) for n, b in enumerate(bleu)}
        if meteor:
            if self._meteor is None:
                raise ValueError("this CaptionScorer was created with meteor=False; create it with meteor=True "
                                 "or score with meteor=False")
            out["METEOR"] = self._meteor_score(gts, res)
        out["ROUGE_L"] = float(self._rouge.compute_score(gts, res)[0])
        out["CIDEr-D"] = float(self._cider.compute_score(gts, res)[0])
        return {m: out[m] for m in METRICS if m in out}

    def _meteor_score(self, gts: dict[str, list[str]], res: dict[str, list[str]]) -> float:
        m = self._meteor
        safe_gts = {k: [r.replace("|||", "").replace("  ", " ") for r in v] for k, v in gts.items()}
        try:
            return float(m.compute_score(safe_gts, res)[0])
        except (ValueError, BrokenPipeError) as e:  # float(b"") after the JVM died, or a closed stdin
            code = m.meteor_p.poll()
            if code is None:
                raise
            m.lock = threading.Lock()  # pycocoevalcap leaves it held on error
            err = m.meteor_p.stderr.read().decode("utf-8", "replace").strip().splitlines()[-5:]
            raise MissingDependencyError(
                f"the METEOR Java process exited with code {code}: {' | '.join(err) or 'no message'}",
                fix="METEOR runs `java -Xmx2G`: free about 2 GB of memory, or pass meteor=False / --no-meteor",
            ) from e

    def score(self, references: Mapping[str, Sequence[str]], candidates: Mapping[str, str], *,
              tokenize: bool = True, meteor: bool = True) -> dict[str, float]:
        """Corpus metrics over the ids of ``candidates``; see :func:`score`."""
        gts, res = self._prepare(references, candidates, tokenize)
        return self._score_prepared(gts, res, meteor)


def score(references: Mapping[str, Sequence[str]], candidates: Mapping[str, str], *, tokenize: bool = True,
          meteor: bool = True, scorer: CaptionScorer | None = None) -> dict[str, float]:
    """BLEU-1..4, METEOR, ROUGE-L, CIDEr-D of one caption per id, as one corpus over the ids of ``candidates``.

    ``references`` maps id -> reference captions (extra ids are ignored); ``candidates`` maps id -> one caption.
    ``tokenize=True`` PTB-tokenises both sides like COCOEvalCap; ``tokenize=False`` passes the strings as they
    are (IDC-PCL's evaluator). Values are pycocoevalcap's (0-1; CIDEr-D unscaled). ``meteor=False`` drops the
    METEOR key and, with ``tokenize=False``, needs no Java. Pass a :class:`CaptionScorer` to reuse its METEOR
    process; otherwise one is started and stopped for this call.

    Raises :class:`ResultsError` naming the id when a candidate has no references or is not a string, and
    :class:`MissingDependencyError` when Java is needed but absent.
    """
    if scorer is not None:
        return scorer.score(references, candidates, tokenize=tokenize, meteor=meteor)
    if tokenize:
        _require_java("the PTB tokenizer")
    with CaptionScorer(meteor=meteor) as s:
        return s.score(references, candidates, tokenize=tokenize, meteor=meteor)


def subsets_of(types: Mapping[str, str], ids) -> dict[str, list[str]]:
    """RCC's subsets of ``ids``: total, semantic (non-distractor), each change type present, distractor."""
    ids = sorted(ids)
    out = {"total": ids, "semantic": [k for k in ids if types[k] != DISTRACTOR]}
    for t in sorted({types[k] for k in ids if types[k] != DISTRACTOR},
                    key=lambda t: (SUBSET_ORDER.index(t) if t in SUBSET_ORDER else len(SUBSET_ORDER), t)):
        out[t] = [k for k in ids if types[k] == t]
    out[DISTRACTOR] = [k for k in ids if types[k] == DISTRACTOR]
    return {name: members for name, members in out.items() if members}


def evaluate_pairs(references: Mapping[str, Sequence[str]], candidates: Mapping[str, str],
                   types: Mapping[str, str], *, tokenize: bool = True, meteor: bool = True,
                   scorer: CaptionScorer | None = None) -> dict[str, dict[str, float]]:
    """RCC's breakdown: ``{subset: {metric: value}}`` for total, semantic, each change type, distractor.

    ``types`` maps every candidate id to its change type (``color``, ``material``, ``add``, ``drop``, ``move``)
    or ``"distractor"``. Each subset is scored as its own corpus, so CIDEr-D's IDF is recomputed on it (RCC
    re-runs COCOEvalCap per subset). Consequence: a subset of ONE pair has CIDEr-D exactly 0, because every
    n-gram's IDF is log(1) - log(1) = 0; that is pycocoevalcap's definition, not a bug. A subset with no
    candidates is omitted. Tokenisation is per sentence, so it is done once for all subsets.
    """
    missing = [k for k in sorted(candidates) if k not in types]
    if missing:
        raise ResultsError(f"{len(missing)} candidate ids have no change type, e.g. {missing[:5]}",
                           fix="pass types for every candidate id (ClevrChange(root).types(split))")
    own = scorer is None
    if own:
        if tokenize:
            _require_java("the PTB tokenizer")
        scorer = CaptionScorer(meteor=meteor)
    try:
        gts, res = scorer._prepare(references, candidates, tokenize)
        out = {}
        parts = subsets_of(types, candidates)
        for name, ids in tqdm(parts.items(), desc="scoring subsets", leave=False, disable=len(candidates) < 2000):
            out[name] = scorer._score_prepared({k: gts[k] for k in ids}, {k: res[k] for k in ids}, meteor)
        return out
    finally:
        if own:
            scorer.close()


# -- RCC result files ------------------------------------------------------------------------------------
def _read_result_list(path: Path) -> list[tuple[str, str]]:
    if not path.is_file():
        raise ResultsError("results file not found", path=path, fix=RESULTS_FIX)
    raw = fileio.read_json(path, list, what="the results file", error=ResultsError, fix=RESULTS_FIX)
    out = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict) or "image_id" not in entry or "caption" not in entry:
            raise ResultsError(f"entry {i} must be an object with keys image_id and caption, got {entry!r:.80}",
                               path=path, fix=RESULTS_FIX)
        pid, cap = entry["image_id"], entry["caption"]
        if not isinstance(pid, str):
            raise ResultsError(f"entry {i}: image_id must be a string like '000123.png', got {pid!r}",
                               path=path, fix=RESULTS_FIX)
        if not isinstance(cap, str):
            raise ResultsError(f"entry {i} (image_id {pid!r}): caption must be a string, got "
                               f"{type(cap).__name__}", path=path, fix=RESULTS_FIX)
        out.append((pid, cap))
    return out


def load_results(path: str | Path) -> dict[str, str]:
    """Read RCC results: a directory with ``sc_results.json`` + ``nsc_results.json``, or one JSON list file.

    Returns ``{image_id: caption}``. Raises :class:`ResultsError` (with the path and the fix) on a missing file,
    bad JSON, an entry without ``image_id``/``caption``, a non-string caption, a duplicate id, or (directory
    form) a ``_n`` id in ``sc_results.json`` / a non-``_n`` id in ``nsc_results.json``.
    """
    path = Path(path)
    if path.is_dir():
        sources = []
        for name in RESULT_FILES:
            entries = _read_result_list(path / name)
            for pid, _ in entries:
                if pid.endswith("_n") != (name == "nsc_results.json"):
                    raise ResultsError(
                        f"id {pid!r} is in the wrong file: sc_results.json holds semantic pairs ('000123.png'), "
                        "nsc_results.json the distractor pairs ('000123.png_n')", path=path / name, fix=RESULTS_FIX)
            sources.append((path / name, entries))
    elif path.exists():
        sources = [(path, _read_result_list(path))]
    else:
        raise ResultsError("results path does not exist", path=path, fix=RESULTS_FIX)
    out: dict[str, str] = {}
    for src, entries in sources:
        for pid, cap in entries:
            if pid in out:
                raise ResultsError(f"duplicate image_id {pid!r}: exactly one caption per pair is scored",
                                   path=src, fix="keep one caption per image_id")
            out[pid] = cap
    return out


def write_results(directory: str | Path, predictions: Mapping[str, str]) -> None:
    """Write ``sc_results.json``, ``nsc_results.json`` and ``total_results.json`` (RCC format), sorted by id.

    Ids ending in ``_n`` go to nsc, the others to sc; ``total_results.json`` holds all of them. Every file is
    written atomically, and only after all captions are checked to be strings.
    """
    bad = [k for k, v in predictions.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise ResultsError(f"ids and captions must be strings; bad ids: {bad[:5]}", path=directory,
                           fix="pass {'000123.png': 'caption', '000123.png_n': 'caption'}")
    rows = [{"image_id": k, "caption": predictions[k]} for k in sorted(predictions)]
    directory = Path(directory)
    fileio.write_json(directory / "sc_results.json", [r for r in rows if not r["image_id"].endswith("_n")], indent=1)
    fileio.write_json(directory / "nsc_results.json", [r for r in rows if r["image_id"].endswith("_n")], indent=1)
    fileio.write_json(directory / "total_results.json", rows, indent=1)


def evaluate_results(results_path: str | Path, data_root: str | Path, split: str = "test", *,
                     tokenize: bool = True, meteor: bool = True,
                     scorer: CaptionScorer | None = None) -> dict[str, dict[str, float]]:
    """Score RCC result files against a split of a CLEVR-Change, Spot-the-Diff or IER root (told from its layout;
    result ids ``000123.png``/``000123.png_n``, ``400.png``, the IER ``uid``): the :func:`evaluate_pairs` breakdown.

    The results must cover the split exactly: ids not in the split, and split ids without a result, both raise
    :class:`ResultsError` (scoring a partial result set would report numbers for a different test set).
    """
    ds = open_dataset(data_root)            # CLEVR-Change, Spot-the-Diff or IER, told from the layout
    references, types = ds.references(split), ds.types(split)
    predictions = load_results(results_path)
    extra = sorted(set(predictions) - set(references))
    if extra:
        raise ResultsError(f"{len(extra)} result ids are not pairs of the {split!r} split of {data_root}, "
                           f"e.g. {extra[:5]}", path=results_path,
                           fix=f"evaluate against the split the results were produced on (--split), and use ids "
                               "like '000123.png' / '000123.png_n'")
    missing = sorted(set(references) - set(predictions))
    if missing:
        raise ResultsError(f"{len(missing)} of the {len(references)} pairs of the {split!r} split have no result, "
                           f"e.g. {missing[:5]}", path=results_path,
                           fix="produce one caption for every pair of the split (a partial set is not scored)")
    return evaluate_pairs(references, predictions, types, tokenize=tokenize, meteor=meteor, scorer=scorer)


# -- reporting -------------------------------------------------------------------------------------------
TABLE_NOTE = "all scores x100 (BLEU, METEOR, ROUGE-L in percent; CIDEr-D x100, as the papers print it)"


def format_table(breakdown: Mapping[str, Mapping[str, float]], counts: Mapping[str, int] | None = None) -> str:
    """A text table of a breakdown, subsets as rows, metrics as columns, every value x100, 2 decimals.

    The scale is the papers': BLEU/METEOR/ROUGE-L as percentages and CIDEr-D x100 (pycocoevalcap's 1.153 prints
    as 115.30). ``counts`` (subset -> number of pairs) adds an ``n`` column.
    """
    import pandas as pd  # local: pandas costs ~0.5 s at import; the training tasks import this module

    rows = [s for s in SUBSET_ORDER if s in breakdown] + [s for s in breakdown if s not in SUBSET_ORDER]
    cols = [m for m in METRICS if any(m in breakdown[s] for s in rows)]
    df = pd.DataFrame([[breakdown[s].get(m, float("nan")) * 100 for m in cols] for s in rows],
                      index=pd.Index(rows, name="subset"), columns=cols)
    if counts is not None:
        df.insert(0, "n", [int(counts.get(s, 0)) for s in rows])
    return df.to_string(float_format=lambda v: f"{v:.2f}")


def is_scores_file(path: Path) -> bool:
    """``{subset: {metric: number}}`` with the evaluator's metric names: what ``--json`` writes."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and bool(doc) and all(
        isinstance(v, dict) and "CIDEr-D" in v and all(isinstance(x, (int, float)) for x in v.values())
        for v in doc.values())
