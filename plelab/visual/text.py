"""Captions as word tokens: the embedded scenes' language is small and closed (≈ 35 words), so a
word-level vocabulary makes every word one token — and the content-word loss (colours, shapes,
sizes, counts, positions) exact rather than approximated over sub-words. Users' captions get the
``max_words`` most frequent words plus ``<unk>``.

Token ids: 0 ``<pad>``, 1 ``<eos>``, 2 ``<unk>``, then words by frequency (ties alphabetical).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from plelab.visual.scenes import CONTENT_WORDS

PAD, EOS, UNK = 0, 1, 2
SPECIALS = ("<pad>", "<eos>", "<unk>")


@dataclass
class WordVocab:
    words: list[str]

    @classmethod
    def build(cls, captions: list[str], max_words: int = 4096) -> WordVocab:
        counts = Counter(w for c in captions for w in c.split())
        ranked = sorted(counts, key=lambda w: (-counts[w], w))[:max_words]
        return cls([*SPECIALS, *ranked])

    def __len__(self) -> int:
        return len(self.words)

    @property
    def index(self) -> dict[str, int]:
        return {w: i for i, w in enumerate(self.words)}

    def encode(self, captions: list[str], length: int) -> tuple[np.ndarray, np.ndarray]:
        """Token ids ``[N, length]`` (words, ``<eos>``, then ``<pad>``; cut at ``length``) and a mask of
        content-word positions ``[N, length]``."""
        idx = self.index
        ids = np.full((len(captions), length), PAD, dtype=np.int64)
        content = np.zeros((len(captions), length), dtype=bool)
        for n, cap in enumerate(captions):
            words = cap.split()[: length - 1]
            ids[n, : len(words)] = [idx.get(w, UNK) for w in words]
            content[n, : len(words)] = [w in CONTENT_WORDS for w in words]
            ids[n, len(words)] = EOS
        return ids, content

    def decode(self, ids) -> str:
        return " ".join(self.words[i] for i in ids if i not in (PAD, EOS))
