"""Token streams: deduplicated document split, one-time tokenisation, batches, validation windows.

- Split: exact-duplicate documents are removed first; then each document goes to validation
  iff ``sha256(text)`` falls below ``val_fraction`` — drawn across the whole corpus, not a
  tail cut, so validation is in-distribution and stable when documents are added.
- Streams: documents are tokenised once, joined with EOS, cached as ``.npy`` and memory-mapped.
- Batches: packed sequences, reshuffled each epoch; step ``k``'s batch is a function of
  ``(seed, k)`` alone (:class:`PackedSampler`), so paired arms, resumed runs and torchrun
  ranks all see the same data.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch
from tokenizers import Tokenizer

from plelab.data.corpus import Corpus
from plelab.data.tokenizer import EOS
from plelab.errors import PlelabError
from plelab.io import atomic_write, cache_dir
from plelab.runtime import EpochOrder

CHUNK_CHARS = 2_000  # a corpus too small to split by documents is split by pieces of about this many characters


def _hash_split(documents: list[str], val_fraction: float) -> tuple[list[str], list[str], int]:
    seen: set[str] = set()
    train, val = [], []
    for doc in documents:
        if doc in seen:
            continue
        seen.add(doc)
        u = int.from_bytes(hashlib.sha256(doc.encode("utf-8")).digest()[:8], "little") / 2**64
        (val if u < val_fraction else train).append(doc)
    return train, val, len(documents) - len(seen)


def split_documents(documents: list[str], val_fraction: float) -> tuple[list[str], list[str], int]:
    """Return ``(train_docs, val_docs, n_duplicates_removed)``, deterministic in the text alone: a distinct
    document goes to validation when the first 8 bytes of its sha256, read as a fraction, are below
    ``val_fraction``."""
    train, val, dups = _hash_split(documents, val_fraction)
    if not train or not val:
        raise PlelabError(f"cannot split {len(train) + len(val)} distinct documents into train and validation at "
                          f"data.val_fraction={val_fraction}; supply more text or change the fraction")
    return train, val, dups


def pieces(document: str, size: int = CHUNK_CHARS) -> list[str]:
    """``document`` cut into consecutive pieces of at most ``size`` characters, each ending at a line break or a
    space in the second half of its window where there is one; the pieces concatenate to the document."""
    out, start = [], 0
    while start < len(document):
        end = min(len(document), start + size)
        if end < len(document):
            cut = max(document.rfind("\n", start + size // 2, end), document.rfind(" ", start + size // 2, end))
            end = cut + 1 if cut >= 0 else end
        out.append(document[start:end])
        start = end
    return out


def split_for_training(documents: list[str], val_fraction: float) -> tuple[list[str], list[str], int, int]:
    """:func:`split_documents`, and only where it fails — a corpus of few, long documents — the same hash split over
    their :func:`pieces`. Returns ``(train, val, n_duplicates_removed, n_pieces)``; ``n_pieces`` is 0 when the
    documents split as they are (every corpus that splits by documents splits exactly as before)."""
    train, val, dups = _hash_split(documents, val_fraction)
    if train and val:
        return train, val, dups, 0
    distinct = [*train, *val]
    cut = [p for doc in distinct for p in pieces(doc)]
    train, val, _ = _hash_split(cut, val_fraction)
    if not train or not val:
        raise PlelabError(f"cannot split {len(distinct)} distinct documents into train and validation at "
                          f"data.val_fraction={val_fraction}, even cut into {len(cut)} pieces of ≤ {CHUNK_CHARS:,} "
                          "characters; supply more text or raise data.val_fraction")
    return train, val, dups, len(cut)


@dataclass
class TokenData:
    """Train and validation token streams (uint32, possibly memory-mapped)."""

    train: np.ndarray
    val: np.ndarray
    corpus_fingerprint: str
    corpus_name: str
    n_train_docs: int
    n_val_docs: int
    n_duplicates: int
    tokenizer_json: str | None = None  # the tokenizer the streams were made with (HF tokenizers JSON)
    n_pieces: int = 0  # > 0: too few documents to split, split as this many pieces (n_*_docs count pieces)

    def train_counts(self, size: int) -> np.ndarray:
        """How often each id occurs in the training stream; ids >= ``size`` are counted at 0 (as the
        per-layer table maps them)."""
        counts = np.bincount(np.asarray(self.train), minlength=size).astype(np.int64)
        counts[0] += counts[size:].sum()
        return counts[:size]

    def unigram_entropy(self, vocab_size: int) -> float:
        """Entropy (nats) of the validation split's unigram distribution: a model that ignores
        context cannot beat it on that split."""
        counts = np.bincount(np.asarray(self.val), minlength=vocab_size).astype(np.float64)
        p = counts[counts > 0] / counts.sum()
        return float(-(p * np.log(p)).sum())


def _encode(tok: Tokenizer, docs: list[str]) -> np.ndarray:
    eos = tok.token_to_id(EOS)
    if eos is None:
        raise PlelabError(f"tokenizer has no {EOS} token; train one with plelab or add it")
    out: list[int] = []
    for enc in tok.encode_batch(docs):
        out += enc.ids
        out.append(eos)
    return np.asarray(out, dtype=np.uint32)


def _save_npy(path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array)


def prepare_tokens(corpus: Corpus, tok: Tokenizer, val_fraction: float) -> TokenData:
    """Split, tokenise once (cached by corpus, tokenizer and fraction) and memory-map the streams."""
    train_docs, val_docs, dups, n_pieces = split_for_training(corpus.documents, val_fraction)
    tok_hash = hashlib.sha256(tok.to_str().encode()).hexdigest()[:12]
    folder = cache_dir("tokens", f"{corpus.fingerprint[:16]}-{tok_hash}-val{val_fraction!r}")
    arrays = {}
    for split, docs in (("train", train_docs), ("val", val_docs)):
        path = folder / f"{split}.npy"
        if not path.exists():
            ids = _encode(tok, docs)
            atomic_write(path, lambda p, ids=ids: _save_npy(p, ids))
        arrays[split] = np.load(path, mmap_mode="r", allow_pickle=False)
    return TokenData(arrays["train"], arrays["val"], corpus.fingerprint, corpus.name, len(train_docs), len(val_docs),
                     dups, tok.to_str(), n_pieces)


class PackedSampler:
    """Packed fixed-length training sequences, reshuffled every epoch, addressed by step.

    The stream is cut into ``n = (len - 1) // T`` sequences of ``T + 1`` tokens starting at
    multiples of ``T`` (consecutive sequences share one boundary token, so no target is lost).
    Epoch ``e`` visits them in the order ``randperm(n)`` seeded by ``(seed, e)``; optimizer step
    ``k`` takes positions ``[k·G, (k+1)·G)`` of that endless sequence, ``G`` the global batch.
    The sampler's whole state is therefore the step number: a resumed run, every rank of a
    torchrun job and every dP arm of a paired study see exactly the same data.
    """

    def __init__(self, stream: np.ndarray, seq_len: int, seed: int) -> None:
        self.stream, self.seq_len, self.seed = stream, seq_len, seed
        self.num_sequences = (len(stream) - 1) // seq_len
        if self.num_sequences < 1:
            raise PlelabError(f"the training split has {len(stream)} tokens, fewer than train.seq_len+1={seq_len + 1}; "
                              "supply more text or lower train.seq_len")
        self._order = EpochOrder(self.num_sequences, seed, lambda e: f"epoch:{e}", keep=3)

    def _perm(self, epoch: int) -> np.ndarray:
        return self._order(epoch).numpy()

    def indices(self, step: int, global_batch: int) -> np.ndarray:
        """Sequence indices of the global batch of optimizer step ``step``."""
        pos = np.arange(step * global_batch, (step + 1) * global_batch)
        return np.array([self._perm(int(q))[int(r)] for q, r in zip(*np.divmod(pos, self.num_sequences))])

    def batch(self, step: int, global_batch: int, rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)`` ``[b, T]`` int64 for ``rows`` of step ``step``'s global batch."""
        T = self.seq_len
        seqs = [np.asarray(self.stream[i * T:i * T + T + 1], dtype=np.int64)
                for i in self.indices(step, global_batch)[rows]]
        t = torch.from_numpy(np.stack(seqs))
        return t[:, :-1], t[:, 1:]

    def epochs(self, steps_done: int, global_batch: int) -> float:
        return steps_done * global_batch / self.num_sequences


def val_windows(stream: np.ndarray, seq_len: int, max_windows: int) -> torch.Tensor:
    """Up to ``max_windows`` non-overlapping windows of ``seq_len + 1``, spread evenly over the
    validation stream. Shape ``[N, T+1]``; the same for every run on the same data."""
    total = (len(stream) - 1) // seq_len
    if total < 1:
        raise PlelabError(f"the validation split has {len(stream)} tokens, fewer than train.seq_len+1={seq_len + 1}; "
                          "raise data.val_fraction or lower train.seq_len")
    idx = np.unique(np.linspace(0, total - 1, num=min(max_windows, total)).round().astype(np.int64))
    rows = np.stack([np.asarray(stream[i * seq_len:i * seq_len + seq_len + 1], dtype=np.int64) for i in idx])
    return torch.from_numpy(rows)


__all__ = ["PackedSampler", "TokenData", "pieces", "prepare_tokens", "split_documents", "split_for_training",
           "val_windows"]
