"""Part-of-speech backends for FDA's Replace and Confuse negatives, returning Penn Treebank tags.

IDC-PCL (paper s.2.2, "Replace") tags captions with the Stanford CoreNLP tool; the public code ships no tagger
at all (only pre-built negative files). The kit offers two backends with one interface:

* ``StanzaTagger``: stanza's English pipeline (tokenize with ``tokenize_pretokenized=True``, pos), the
  successor of CoreNLP's tagger, used only when its English models are already on disk. It never downloads
  (``download_method=None``); availability is decided from files, without network.
* ``LexiconTagger``: a closed-vocabulary tagger that needs no downloaded data. It knows the closed word classes,
  the CLEVR and bird-description domain vocabularies, and a few morphological rules checked against the
  training captions. Deviation from the paper: it is a rule-based stand-in for CoreNLP, imperfect by design;
  ``tests/test_pos.py`` measures its accuracy on a hand-tagged sample of real caption shapes.

``get_tagger("auto" | "stanza" | "lexicon", train_captions)`` picks one; ``tagger.name`` records which.

Every tagger takes whitespace-tokenised sentences (CLEVR-Change captions and Birds-to-Words descriptions are
both lower-cased and pre-tokenised) and returns one tag per token.
"""
from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Iterable, Protocol, Sequence

from idckit.data.synth import vocab
from idckit.errors import ConfigError, MissingDependencyError

STANZA_FIX = (
    "install stanza's English models where a network is available: "
    "python -c \"import stanza; stanza.download('en')\" (or point STANZA_RESOURCES_DIR at a copy of them), "
    "or use tagger='lexicon'"
)


class Tagger(Protocol):
    name: str
    version: str

    def tag(self, tokens: Sequence[str]) -> list[str]: ...

    def tag_many(self, sentences: Sequence[Sequence[str]]) -> list[list[str]]: ...


# --------------------------------------------------------------------------------------------------------------
# Lexicons. Tags follow the Penn Treebank guidelines as CoreNLP applies them to these caption shapes.
# --------------------------------------------------------------------------------------------------------------
def _words(tag: str, text: str) -> dict[str, str]:
    return {w: tag for w in text.split()}


CLOSED: dict[str, str] = {
    **_words("DT", "the a an this these those each every no any some all another either neither"),
    **_words("IN", "of in on at from with without than as behind near under over above below between into onto "
                   "by for about like while because since after before around across through toward towards "
                   "beside besides except unlike upon within along against whereas although though if whether "
                   "throughout underneath beneath via per"),
    **_words("TO", "to"),
    **_words("CC", "and or but nor yet plus"),
    **_words("PRP", "it they them he she i we you him itself themselves"),
    **_words("PRP$", "its their his my our your"),
    **_words("WDT", "which"),
    **_words("WP", "who what"),
    **_words("WRB", "where when how"),
    **_words("MD", "can could will would may might should must shall"),
    **_words("VBZ", "is has does seems appears looks remains"),
    **_words("VBP", "are have do am"),
    **_words("VBD", "was were did had became"),
    **_words("VB", "be become"),
    **_words("VBN", "been gone"),
    **_words("VBG", "being missing having"),
    **_words("RB", "not n't very also too quite rather somewhat fairly really just only even still almost "
                   "instead however overall then here again maybe perhaps so"),
    **_words("EX", "there"),
    **_words("CD", "one two three four five six seven eight nine ten zero"),
    **_words("JJ", "same different other identical new similar entire whole several many few"),
    **_words("NN", "nothing something everything anything none"),
    "'": "POS",
    ".": ".", "!": ".", "?": ".", ",": ",", ";": ":", ":": ":", "-": ":", "--": ":",
    "(": "-LRB-", ")": "-RRB-", '"': "''", "`": "``", "``": "``", "''": "''",
}

# Verbs the captions use, with their Penn tag by form (past forms that are also participles are resolved in
# context: after a form of be/have they are VBN).
VERB_FORMS: dict[str, str] = {
    **_words("VB", "change turn move add place appear disappear modify remain seem look make go occur compare "
                   "resemble differ tend stand show extend reach cover"),
    **_words("VBZ", "changes turns moves adds places disappears modifies occurs compares resembles differs "
                    "tends stands shows extends reaches covers makes goes"),
    **_words("VBD", "changed turned moved added placed appeared disappeared modified remained seemed looked "
                    "made occurred compared resembled differed tended stood showed extended reached covered "
                    "went"),
    **_words("VBP", "appear seem look remain"),
}
PARTICIPLE_AUX = frozenset("is are was were be been being has have had 's".split())

CLEVR_NOUNS = ("cube block sphere ball cylinder thing object rubber metal location scene difference change color "
               "colour size shape material side front").split()
CLEVR_ADJECTIVES = ("gray grey red blue green brown purple cyan yellow large small big tiny metallic matte shiny "
                    "left right").split()
BIRD_NOUNS = ("bird animal beak bill head crown nape neck throat breast chest belly abdomen back wing tail leg "
              "foot feet eye eyering cheek face forehead chin rump flank body feather plumage stripe streak "
              "spot patch bar band ring crest mask eyebrow eyestripe eyeline supercilium lore covert tip edge "
              "base pattern marking shade tone hue area part bit line length tarsus talon claw mandible "
              "undertail underside underbelly upperparts underparts wingbar plume contrast coloring "
              "coloration shoulder toe nostril top bottom middle center centre half amount lot majority "
              "rest mix hint tinge touch dot speckle fleck variety beige tan buff olive cream rust").split()
BIRD_ADJECTIVES = ("white black orange pink golden silver dark light pale bright dull vibrant vivid solid rusty "
                   "long short thick thin slender skinny stout plump round pointy sharp blunt straight "
                   "plain uniform distinct prominent noticeable visible fluffy sleek smooth narrow wide broad "
                   "flat stubby chunky stocky heavy colorful colourful upper lower rear inner outer full "
                   "high low deep soft faint bold heavy small-ish whitish blackish grayish greyish brownish "
                   "reddish yellowish greenish bluish orangish pinkish darkish lightish tiny medium").split()
# Denominal "-ed" adjectives of bird descriptions ("striped", "spotted"): JJ, never a verb.
ED_ADJECTIVES = ("striped spotted speckled streaked mottled barred pointed curved hooked rounded crested forked "
                 "notched webbed colored coloured patterned tipped banded ringed defined detailed").split()
REFERENTS = ("animal1", "animal2")

_PUNCT = re.compile(r"^[^\w]+$")
_NUM = re.compile(r"^\d+([.,]\d+)?$")


def _stems(word: str, suffix: str) -> list[str]:
    """Candidate stems of an inflected form: bigger -> big, larger -> large, happier -> happy, darker -> dark."""
    base = word[: -len(suffix)]
    out = [base, base + "e"]
    if len(base) > 2 and base[-1] == base[-2]:
        out.append(base[:-1])
    if base.endswith("i"):
        out.append(base[:-1] + "y")
    return out


class LexiconTagger:
    """A rule-based Penn tagger for caption English; needs no downloaded data.

    Order of decisions for a token (first match wins):

    1. punctuation, numbers, the referent tokens ``animal1``/``animal2`` (NNP), closed-class words, verb forms,
       and the domain lexicons (CLEVR colours/sizes/materials/shapes from ``idckit.data.synth.vocab``; bird
       parts, colours, shapes and patterns);
    2. morphology, with stems checked against the lexicons and the training captions: ``-est`` -> JJS and
       ``-er`` -> JJR when the stem is a known adjective or a training word of at least 3 letters that is
       neither a noun nor a closed-class word; ``-ly`` -> RB; ``-ish``/``-ous``/``-ful``/``-ive``/``-ic``
       -> JJ; ``-ed`` -> JJ when the stem is a known noun ("striped"), otherwise a verb; ``-ing`` -> VBG;
       ``-s`` -> VBZ when the stem is a known verb, otherwise NNS (``-ss``/``-us``/``-is`` words are NN);
    3. **unknown words are NN** (the commonest open class in captions, and CoreNLP's usual guess);
    4. context rules: an ambiguous noun/verb ("change", "spot", "look") is a noun after a determiner,
       adjective or possessive; a past form after be/have is VBN, otherwise VBD; "that" after a noun is WDT;
       "there" before a form of be is EX, otherwise RB; "no longer" is RB RB; "left"/"right" between
       "the" and "of" are NN; "both" before a later "and" is CC; "more"/"less" before an adjective are RBR;
       "'s" split as "' s" is tagged POS POS.
    """

    name = "lexicon"
    version = "lexicon-1"

    def __init__(self, train_captions: Iterable[str] = ()):
        self.lexicon: dict[str, str] = {}
        for w in CLEVR_NOUNS + BIRD_NOUNS:
            self.lexicon[w] = "NN"
        for w in CLEVR_ADJECTIVES + BIRD_ADJECTIVES + ED_ADJECTIVES:
            self.lexicon[w] = "JJ"
        # the CLEVR object vocabulary the synthetic generator uses, so the two never drift apart
        for w in list(vocab.COLORS) + list(vocab.SIZES):
            self.lexicon.setdefault(w, "JJ")
        for w in vocab.SHAPES + vocab.MATERIALS:
            self.lexicon.setdefault(w, "NN")
        for w in VERB_FORMS:
            self.lexicon.setdefault(w, VERB_FORMS[w])
        self.lexicon.update(CLOSED)
        for w in REFERENTS:
            self.lexicon[w] = "NNP"
        for w in ("feet", "teeth", "geese", "people"):  # irregular plurals
            self.lexicon[w] = "NNS"
        self.nouns = {w for w, t in self.lexicon.items() if t == "NN"}
        self.adjectives = {w for w, t in self.lexicon.items() if t == "JJ"}
        self.verb_stems = {w for w, t in VERB_FORMS.items() if t == "VB"} | {"ha", "do", "i"}
        # Words seen in the training captions: the evidence for morphological stems ("thinner" -> "thin").
        self.corpus_words: set[str] = set()
        for caption in train_captions:
            self.corpus_words.update(caption.lower().split())
        self._cache: dict[str, str] = {}

    # -- lexical tag -------------------------------------------------------------------------------------------
    def _is_adjective_stem(self, stem: str) -> bool:
        if stem in self.adjectives:
            return True
        return (len(stem) >= 3 and stem in self.corpus_words and stem not in self.nouns
                and stem not in self.lexicon)

    def lexical_tag(self, word: str) -> str:
        """The context-free tag of a lower-cased word (cached)."""
        tag = self._cache.get(word)
        if tag is None:
            tag = self._cache[word] = self._lexical_tag(word)
        return tag

    def _lexical_tag(self, w: str) -> str:
        if w in self.lexicon:
            return self.lexicon[w]
        if _NUM.match(w):
            return "CD"
        if _PUNCT.match(w):
            return ":"
        if w.endswith("est") and len(w) > 5 and any(self._is_adjective_stem(s) for s in _stems(w, "est")):
            return "JJS"
        if w.endswith("er") and len(w) > 4 and any(self._is_adjective_stem(s) for s in _stems(w, "er")):
            return "JJR"
        if w.endswith("ly") and len(w) > 4:
            return "RB"
        if w.endswith(("ish", "ous", "ful", "ive", "ic")) and len(w) > 5:
            return "JJ"
        if "-" in w:  # "black-and-white", "orange-ish": compound modifiers
            return "JJ"
        if w.endswith("ed") and len(w) > 4:
            if any(s in self.nouns for s in _stems(w, "ed") + _stems(w, "d")):
                return "JJ"
            return "VBD"
        if w.endswith("ing") and len(w) > 5:
            return "VBG"
        if w.endswith("s") and not w.endswith(("ss", "us", "is")) and len(w) > 3:
            stems = [w[:-1], w[:-2] if w.endswith("es") else w[:-1], w[:-3] + "y" if w.endswith("ies") else w]
            if any(s in self.verb_stems for s in stems) and not any(s in self.nouns for s in stems):
                return "VBZ"
            return "NNS"
        return "NN"

    # -- tagging with context ------------------------------------------------------------------------------------
    def tag(self, tokens: Sequence[str]) -> list[str]:
        words = [t.lower() for t in tokens]
        tags = [self.lexical_tag(w) for w in words]
        n = len(words)
        for i, w in enumerate(words):
            prev_w = words[i - 1] if i else ""
            prev_t = tags[i - 1] if i else ""
            next_w = words[i + 1] if i + 1 < n else ""
            next_t = tags[i + 1] if i + 1 < n else ""
            t = tags[i]
            if t in ("VB", "VBP", "VBZ") and w not in PARTICIPLE_AUX and w not in ("does", "do"):
                if prev_t in ("DT", "JJ", "JJR", "JJS", "PRP$", "POS", "CD") or prev_w == "no":
                    tags[i] = "NNS" if t == "VBZ" else "NN"  # "no change", "a look", "its turns"
                elif t == "VB" and prev_t in ("NN", "NNS", "NNP", "PRP"):
                    tags[i] = "VBP"
            elif t == "VBD" and prev_w in PARTICIPLE_AUX | {"newly"}:
                tags[i] = "VBN"
            elif t == "VBD" and words[i - 2 if i > 1 else 0] in PARTICIPLE_AUX and prev_t == "RB":
                tags[i] = "VBN"  # "has been newly placed", "is slightly curved" handled by JJ lexicon
            if w == "that":
                if prev_t in ("NN", "NNS", "NNP"):
                    tags[i] = "WDT"
                elif next_t in ("NN", "NNS", "JJ"):
                    tags[i] = "DT"
                else:
                    tags[i] = "IN"
            elif w == "there":
                tags[i] = "EX" if next_w in ("is", "are", "was", "were", "seems", "appears") else "RB"
            elif w == "longer" and prev_w == "no":
                tags[i] = "RB"
            elif w == "no" and next_w == "longer":
                tags[i] = "RB"
            elif w in ("left", "right"):
                tags[i] = "NN" if (prev_w == "the" and next_w == "of") else "JJ"
            elif w == "both":
                tags[i] = "CC" if "and" in words[i + 1:] else "DT"
            elif w in ("more", "less"):
                tags[i] = "RBR" if next_t.startswith("JJ") else "JJR"
            elif w == "most":
                tags[i] = "RBS" if next_t.startswith("JJ") else "JJS"
            elif w == "her":
                tags[i] = "PRP$" if next_t.startswith(("NN", "JJ")) else "PRP"
            elif w == "s" and prev_w == "'":
                tags[i] = "POS"
            elif w == "'s":
                tags[i] = "VBZ" if next_t.startswith(("VB", "DT", "JJ", "RB")) and prev_t == "PRP" else "POS"
        return tags

    def tag_many(self, sentences: Sequence[Sequence[str]]) -> list[list[str]]:
        return [self.tag(s) for s in sentences]


# --------------------------------------------------------------------------------------------------------------
# stanza
# --------------------------------------------------------------------------------------------------------------
def stanza_resources_dir() -> Path | None:
    """Where stanza looks for its models, computed without importing stanza (importing it loads torch)."""
    env = os.environ.get("STANZA_RESOURCES_DIR")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("stanza")
    if spec is None or not spec.submodule_search_locations:
        return None
    version_file = Path(list(spec.submodule_search_locations)[0]) / "_version.py"
    match = re.search(r"__resources_version__\s*=\s*['\"]([^'\"]+)", version_file.read_text()) \
        if version_file.exists() else None
    if match is None:  # an unknown layout: ask stanza itself
        from stanza.resources.common import DEFAULT_MODEL_DIR  # local: optional dependency (loads torch)

        return Path(DEFAULT_MODEL_DIR)
    # local: installed with stanza (optional), which uses it for the same path
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("stanza", "StanfordNLP", match.group(1))) / "resources"


def stanza_available(resources_dir: str | Path | None = None) -> bool:
    """True when stanza is installed and its English tokenize and pos models (with their pretrained word
    vectors) are on disk. Decided from files only: never touches the network."""
    if importlib.util.find_spec("stanza") is None:
        return False
    root = Path(resources_dir) if resources_dir is not None else stanza_resources_dir()
    if root is None or not (root / "resources.json").is_file():
        return False
    en = root / "en"
    return all(any((en / sub).glob("*.pt")) for sub in ("tokenize", "pos", "pretrain"))


class StanzaTagger:
    """stanza's English POS tagger on pre-tokenised text; Penn tags come from ``word.xpos``."""

    name = "stanza"

    def __init__(self, resources_dir: str | Path | None = None, *, batch_size: int = 256):
        root = Path(resources_dir) if resources_dir is not None else stanza_resources_dir()
        if not stanza_available(root):
            raise MissingDependencyError(
                "stanza's English models (tokenize, pos, pretrain) are not on disk; the kit never downloads them",
                path=root, fix=STANZA_FIX)
        import stanza  # local: optional dependency, kept off the training path (test_import_hygiene)

        self.version = f"stanza-{stanza.__version__}"
        try:
            self._nlp = stanza.Pipeline("en", dir=str(root), processors="tokenize,pos",
                                        tokenize_pretokenized=True, download_method=None, verbose=False,
                                        pos_batch_size=batch_size)
        except Exception as exc:  # stanza raises several types for missing or broken files
            raise MissingDependencyError(f"stanza's English pipeline failed to load: {exc}", path=root,
                                         fix=STANZA_FIX) from exc

    def tag(self, tokens: Sequence[str]) -> list[str]:
        return self.tag_many([tokens])[0]

    def tag_many(self, sentences: Sequence[Sequence[str]]) -> list[list[str]]:
        sentences = [list(s) for s in sentences]
        out: list[list[str]] = [[] for _ in sentences]
        todo = [i for i, s in enumerate(sentences) if s]
        if todo:
            doc = self._nlp([sentences[i] for i in todo])
            for i, sent in zip(todo, doc.sentences):
                out[i] = [w.xpos for w in sent.words]
        return out


def get_tagger(kind: str = "auto", train_captions: Iterable[str] = ()) -> Tagger:
    """``auto``: stanza if its English models are on disk, else the lexicon tagger. ``stanza`` without models
    raises ``MissingDependencyError`` naming the fix."""
    if kind == "auto":
        kind = "stanza" if stanza_available() else "lexicon"
    if kind == "stanza":
        return StanzaTagger()
    if kind == "lexicon":
        return LexiconTagger(train_captions)
    raise ConfigError(f"unknown POS tagger {kind!r}", fix="use 'auto', 'stanza' or 'lexicon'")


def resolve_tagger_name(kind: str) -> str:
    """The backend ``get_tagger(kind)`` would pick, without building it (used for cache keys)."""
    if kind == "auto":
        return "stanza" if stanza_available() else "lexicon"
    if kind not in ("stanza", "lexicon"):
        raise ConfigError(f"unknown POS tagger {kind!r}", fix="use 'auto', 'stanza' or 'lexicon'")
    return kind
