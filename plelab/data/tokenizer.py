"""Byte-level BPE trained locally with HF ``tokenizers`` on a bounded, streamed sample of the corpus.

The saved ``tokenizer.json`` loads in HF (``PreTrainedTokenizerFast(tokenizer_file=...)``).
Id 0 is ``<|endoftext|>``, used as the document separator.

The sample (:func:`hash_sample`): the documents with the smallest hash fractions whose characters add up to
at most ``data.tokenizer_sample_chars``, in corpus order — drawn from the whole corpus whatever its size or
compression. A corpus smaller than the sample (the embedded one) is taken whole, so its tokenizer is exactly
the one trained on all of it. Memory: the sample itself while it is drawn, then the trainer's word counts.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from plelab.data.corpus import Corpus, corpus_fingerprint
from plelab.errors import PlelabError
from plelab.io import atomic_write, cache_dir

EOS = "<|endoftext|>"


def train_tokenizer(corpus: Corpus | Iterable[str], vocab_size: int, show_progress: bool = True) -> Tokenizer:
    """Train a byte-level BPE of exactly ``vocab_size`` entries (256 bytes + merges + EOS) at most, on a
    corpus or any iterable of documents (streamed)."""
    if vocab_size < 257 + 1:
        raise PlelabError(f"model.vocab_size={vocab_size} is too small for a byte-level BPE tokenizer; "
                          "use at least 258 (256 bytes + EOS + one merge)")
    docs = corpus.documents if isinstance(corpus, Corpus) else corpus
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=show_progress,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs) if isinstance(docs, list) else None)
    return tok


def load_tokenizer(path: str | Path) -> Tokenizer:
    p = Path(path)
    try:
        return Tokenizer.from_file(str(p))
    except Exception as err:  # tokenizers raises a bare Exception on bad JSON
        raise PlelabError(f"cannot load tokenizer {p}: {str(err).splitlines()[0]}; pass a HF tokenizer.json") from None


def check_fits(tok: Tokenizer, vocab_size: int) -> Tokenizer:
    if tok.get_vocab_size() > vocab_size:
        raise PlelabError(f"tokenizer has {tok.get_vocab_size()} entries but model.vocab_size={vocab_size}; "
                          f"set --set model.vocab_size={tok.get_vocab_size()} or larger")
    return tok


def hash_sample(documents: Iterable[str], max_chars: int) -> list[str]:
    """The tokenizer sample: the documents whose hash fractions are smallest (the second 64-bit word of their
    sha256) and whose characters add up to at most ``max_chars``, returned in corpus order. A corpus within
    ``max_chars`` is taken whole, in order. One pass; memory: the sample itself (a bounded max-heap)."""
    heap: list[tuple[float, int, str]] = []  # (-u, position, doc): the largest u on top
    total = 0
    for pos, doc in enumerate(documents):
        u = int.from_bytes(hashlib.sha256(doc.encode("utf-8")).digest()[8:16], "little") / 2**64
        if total + len(doc) <= max_chars:
            heapq.heappush(heap, (-u, pos, doc))
            total += len(doc)
            continue
        if heap and -heap[0][0] <= u:
            continue
        heapq.heappush(heap, (-u, pos, doc))
        total += len(doc)
        while total > max_chars and len(heap) > 1:
            total -= len(heapq.heappop(heap)[2])
    return [doc for _, _, doc in sorted(heap, key=lambda t: t[1])]


def sampled_tokenizer(sample: list[str], vocab_size: int, show_progress: bool = True) -> Tokenizer:
    """The BPE of ``sample`` (:func:`hash_sample`), cached by the sample's fingerprint and ``vocab_size``; a sample
    that is the whole corpus has the corpus's own fingerprint as its key, so its tokenizer is the one every
    earlier run trained."""
    cached = cache_dir("tokenizers") / f"{corpus_fingerprint(sample)[:16]}-v{vocab_size}.json"
    if cached.exists():
        return check_fits(load_tokenizer(cached), vocab_size)
    if not sample:
        raise PlelabError("the tokenizer sample is empty: the data holds no text; pass non-empty UTF-8 text")
    tok = train_tokenizer(sample, vocab_size, show_progress)
    atomic_write(cached, lambda p: tok.save(str(p)))
    return check_fits(tok, vocab_size)


def get_tokenizer(corpus: Corpus, vocab_size: int, path: str | None = None, show_progress: bool = True) -> Tokenizer:
    """A supplied ``tokenizer.json``, else the cached BPE for (corpus, vocab size), training it once: the corpus
    taken whole as its own sample (:func:`sampled_tokenizer`)."""
    if path is not None:
        return check_fits(load_tokenizer(path), vocab_size)
    return sampled_tokenizer(corpus.documents, vocab_size, show_progress)
