"""Byte-level BPE trained locally with HF ``tokenizers`` on a bounded, streamed sample of the corpus.

The saved ``tokenizer.json`` loads in HF (``PreTrainedTokenizerFast(tokenizer_file=...)``).
Id 0 is ``<|endoftext|>``, used as the document separator.

The sample: every document whose second 64-bit hash word, read as a fraction, is below
``sample_chars / (estimated characters of the sources)``, in corpus order, until ``sample_chars``
characters are taken. A corpus smaller than the sample (the embedded one) is taken whole, so its
tokenizer is exactly the one trained on all of it. The trainer's memory is its word counts: bounded by
the sample, not the corpus.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from plelab.data.corpus import Corpus
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


class Sample:
    """The bounded tokenizer sample of a stream of documents; ``fingerprint`` (after iterating) hashes what was
    taken exactly as :attr:`Corpus.fingerprint` hashes a corpus, and ``whole`` says whether that was everything."""

    def __init__(self, documents: Iterable[str], rate: float, max_chars: int) -> None:
        self.documents, self.rate, self.max_chars = documents, rate, max_chars
        self._hash, self.chars, self.whole = hashlib.sha256(), 0, rate >= 1

    def __iter__(self) -> Iterator[str]:
        for doc in self.documents:
            data = doc.encode("utf-8")
            if self.rate < 1:
                u = int.from_bytes(hashlib.sha256(data).digest()[8:16], "little") / 2**64
                if u >= self.rate:
                    continue
            if self.chars >= self.max_chars:
                self.whole = False
                return
            self._hash.update(len(data).to_bytes(8, "little"))
            self._hash.update(data)
            self.chars += len(doc)
            yield doc

    @property
    def fingerprint(self) -> str:
        return self._hash.hexdigest()


def sampled_tokenizer(documents: Callable[[], Iterable[str]], vocab_size: int, rate: float, max_chars: int,
                      show_progress: bool = True) -> tuple[Tokenizer, Sample]:
    """The BPE of the sample of ``documents()`` (called twice at most: hashing the sample, then training on it),
    cached by the sample's fingerprint and ``vocab_size``; a sample that is the whole corpus is keyed by the
    corpus's own fingerprint, so its tokenizer is the one every earlier run trained."""
    sample = Sample(documents(), rate, max_chars)
    for _ in sample:
        pass
    cached = cache_dir("tokenizers") / f"{sample.fingerprint[:16]}-v{vocab_size}.json"
    if cached.exists():
        return check_fits(load_tokenizer(cached), vocab_size), sample
    if not sample.chars:
        raise PlelabError("the tokenizer sample is empty: the data holds no text; pass non-empty UTF-8 text")
    tok = train_tokenizer(Sample(documents(), rate, max_chars), vocab_size, show_progress)
    atomic_write(cached, lambda p: tok.save(str(p)))
    return check_fits(tok, vocab_size), sample


def get_tokenizer(corpus: Corpus, vocab_size: int, path: str | None = None, show_progress: bool = True) -> Tokenizer:
    """A supplied ``tokenizer.json``, else the cached BPE for (corpus, vocab size), training it once."""
    if path is not None:
        return check_fits(load_tokenizer(path), vocab_size)
    cached = cache_dir("tokenizers") / f"{corpus.fingerprint[:16]}-v{vocab_size}.json"
    if cached.exists():
        return check_fits(load_tokenizer(cached), vocab_size)
    tok = train_tokenizer(corpus, vocab_size, show_progress)
    atomic_write(cached, lambda p: tok.save(str(p)))
    return check_fits(tok, vocab_size)
