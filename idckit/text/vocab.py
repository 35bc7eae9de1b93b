"""Word vocabulary for IDC-PCL: the public code's ``dict.json`` shape (word -> id), with fixed special ids.

The specials come first in a fixed order, so a vocabulary file written by the kit always maps them to the same
ids (the public fine-tuning code hard-codes ``BOS=1`` and ``MASK=5``; the kit reads the ids from here instead).
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

import torch

from idckit.errors import ConfigError
from idckit.fileio import write_json

SPECIALS = ("[PAD]", "[BOS]", "[EOS]", "[UNK]", "[MASK]", "[IMG1]", "[IMG2]", "[CLS]")
#: how :meth:`Vocab.decode` writes a special met before [EOS]: left out (the kit's) or kept as a word (the authors')
SPECIAL_WORDS = ("drop", "keep")
#: how many words a caption of ``max_len`` tokens keeps, by the slots left beside them: "max_len - 2" ([BOS] and
#: [EOS], the kit's) or "max_len - 3" (the authors': their ``padding`` cuts at max_len - 3 words and pads to
#: max_len, so the last slot is always [PAD]; clver/data/dataset_pretrain_clver.py:151-152)
WORDS_KEPT = {"max_len - 2": 2, "max_len - 3": 3}
_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[^\sa-z0-9]")


def tokenize(text: str) -> list[str]:
    """Lower-cased words and punctuation marks: ``"The red cube moved."`` -> the red cube moved ."""
    return _TOKEN.findall(text.lower())


class Vocab:
    pad_id, bos_id, eos_id, unk_id, mask_id, img1_id, img2_id, cls_id = range(len(SPECIALS))
    n_special = len(SPECIALS)

    def __init__(self, words: Sequence[str]):
        if tuple(words[:self.n_special]) != SPECIALS:
            raise ConfigError(f"a vocabulary must start with the specials {SPECIALS}")
        self.words = list(words)
        self.ids = {w: i for i, w in enumerate(self.words)}
        if len(self.ids) != len(self.words):
            raise ConfigError("a vocabulary has duplicate words")

    @classmethod
    def build(cls, captions: Iterable[str], min_count: int = 1) -> "Vocab":
        """Specials, then every token seen ``min_count`` times or more, by count (descending) then alphabetically."""
        counts = Counter(t for c in captions for t in tokenize(c))
        words = sorted((w for w, n in counts.items() if n >= min_count and w not in SPECIALS),
                       key=lambda w: (-counts[w], w))
        return cls(list(SPECIALS) + words)

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, text: str, max_len: int, words_kept: str = "max_len - 2") -> list[int]:
        """[BOS] words [EOS], words truncated to ``words_kept`` (:data:`WORDS_KEPT`) so the whole fits ``max_len``
        (EOS always kept)."""
        if words_kept not in WORDS_KEPT:
            raise ConfigError(f"words_kept must be one of {', '.join(map(repr, WORDS_KEPT))}, got {words_kept!r}",
                              fix='"max_len - 3" is the authors\' truncation (paper profile), "max_len - 2" the kit\'s')
        if max_len < WORDS_KEPT[words_kept] + 1:
            raise ConfigError(f"max_len must leave room for [BOS] a word [EOS] at words_kept {words_kept!r}, "
                              f"got {max_len}")
        words = [self.ids.get(t, self.unk_id) for t in tokenize(text)][:max_len - WORDS_KEPT[words_kept]]
        return [self.bos_id, *words, self.eos_id]

    def encode_batch(self, texts: Sequence[str], max_len: int, words_kept: str = "max_len - 2") -> torch.LongTensor:
        """[N, max_len]: :meth:`encode` of each text, padded with [PAD]."""
        out = torch.full((len(texts), max_len), self.pad_id, dtype=torch.long)
        for i, t in enumerate(texts):
            ids = self.encode(t, max_len, words_kept)
            out[i, :len(ids)] = torch.tensor(ids)
        return out

    def decode(self, ids: Iterable[int], special_words: str = "drop") -> str:
        """The words of ``ids`` up to the first [EOS], space-separated.

        ``special_words="drop"`` leaves every special out (the kit's). ``"keep"`` is the authors' decoding (yaolinli/IDC
        6f3aabf, ``transform`` in clver/finetune.py:437-445 and bird/finetune.py:410-418): only [BOS] is skipped, and
        an [UNK], [PAD], [MASK] or [CLS] before the [EOS] stays a word, so it counts against the references as theirs
        does (their <UNK> is the kit's [UNK]: the spelling matches no reference word either way)."""
        if special_words not in SPECIAL_WORDS:
            raise ConfigError(f"special_words must be one of {SPECIAL_WORDS}, got {special_words!r}")
        keep = special_words == "keep"
        words = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i == self.bos_id or not 0 <= i < len(self.words):
                continue
            if keep or i >= self.n_special:
                words.append(self.words[i])
        return " ".join(words)

    def save(self, path: str | Path) -> None:
        """A JSON word -> id map, written atomically."""
        write_json(path, self.ids, indent=0)

    @classmethod
    def load(cls, path: str | Path) -> "Vocab":
        """Read a word -> id JSON map written by :meth:`save` (the public code's ``dict.json`` shape)."""
        path = Path(path)
        fix = "use the vocab.json written by a finished run, or rebuild it with Vocab.build(train captions).save(path)"
        if not path.is_file():
            raise ConfigError("vocabulary file not found", path=path, fix=fix)
        try:
            mapping = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(mapping, dict) or not all(isinstance(i, int) for i in mapping.values()):
                raise ValueError("expected a JSON object word -> integer id")
            words = sorted(mapping, key=mapping.get)
            if [mapping[w] for w in words] != list(range(len(words))):
                raise ValueError("the ids are not 0..N-1, each once")
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(f"not a vocabulary file ({exc})", path=path, fix=fix) from exc
        if tuple(words[:cls.n_special]) != SPECIALS:
            raise ConfigError(f"not a kit vocabulary: ids 0..{cls.n_special - 1} must be the specials {SPECIALS}, "
                              f"got {words[:cls.n_special]}", path=path, fix=fix)
        return cls(words)
