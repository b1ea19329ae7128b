"""Byte-level BPE trained locally with HF ``tokenizers``, cached by corpus fingerprint + vocab size.

The saved ``tokenizer.json`` loads in HF (``PreTrainedTokenizerFast(tokenizer_file=...)``).
Id 0 is ``<|endoftext|>``, used as the document separator.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from plelab.data.corpus import Corpus
from plelab.errors import PlelabError
from plelab.io import atomic_write, cache_dir

EOS = "<|endoftext|>"


def train_tokenizer(corpus: Corpus, vocab_size: int, show_progress: bool = True) -> Tokenizer:
    """Train a byte-level BPE of exactly ``vocab_size`` entries (256 bytes + merges + EOS) at most."""
    if vocab_size < 257 + 1:
        raise PlelabError(f"model.vocab_size={vocab_size} is too small for a byte-level BPE tokenizer; "
                          "use at least 258 (256 bytes + EOS + one merge)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=show_progress,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus.documents, trainer=trainer, length=len(corpus.documents))
    return tok


def load_tokenizer(path: str | Path) -> Tokenizer:
    p = Path(path)
    try:
        return Tokenizer.from_file(str(p))
    except Exception as err:  # tokenizers raises a bare Exception on bad JSON
        raise PlelabError(f"cannot load tokenizer {p}: {str(err).splitlines()[0]}; pass a HF tokenizer.json") from None


def get_tokenizer(corpus: Corpus, vocab_size: int, path: str | None = None, show_progress: bool = True) -> Tokenizer:
    """A supplied ``tokenizer.json``, else the cached BPE for (corpus, vocab size), training it once."""
    if path is not None:
        tok = load_tokenizer(path)
    else:
        cached = cache_dir("tokenizers") / f"{corpus.fingerprint[:16]}-v{vocab_size}.json"
        if cached.exists():
            tok = load_tokenizer(cached)
        else:
            tok = train_tokenizer(corpus, vocab_size, show_progress)
            atomic_write(cached, lambda p: tok.save(str(p)))
    if tok.get_vocab_size() > vocab_size:
        raise PlelabError(f"tokenizer has {tok.get_vocab_size()} entries but model.vocab_size={vocab_size}; "
                          f"set --set model.vocab_size={tok.get_vocab_size()} or larger")
    return tok
