"""An out-of-distribution validation set (``data.ood``): text from outside the training corpus, encoded with the
run's tokenizer and cut into fixed windows that every evaluation scores beside the validation split.

``data.ood=other-libraries`` is the docstrings of libraries installed with every plelab that neither embedded
training corpus holds (:data:`~plelab.data.corpus.OTHER_LIBRARIES`); a path is the user's text (any form
``--data`` reads). The documents are encoded back to back, each followed by EOS (as the training shards are), and
:func:`~plelab.data.tokens.val_windows` takes up to the validation set's number of windows, spread evenly: the
same windows for every run with the same tokenizer, so an arm's OOD loss is paired with its baseline's by seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from plelab.config.schema import OTHER_LIBRARIES
from plelab.data.corpus import other_libraries_corpus
from plelab.data.sources import load_corpus
from plelab.data.streaming import encode_documents
from plelab.data.tokenizer import EOS
from plelab.data.tokens import val_windows
from plelab.errors import PlelabError


@dataclass(frozen=True)
class OODSet:
    """The OOD windows ``[N, T+1]`` and what they were cut from (corpus name and sha256 fingerprint)."""

    name: str
    fingerprint: str
    windows: torch.Tensor


def ood_set(ood: str, tokenizer_json: str | None, seq_len: int, max_windows: int, train_fingerprint: str,
            text_field: str = "text") -> OODSet:
    """The OOD set of ``data.ood = ood``, encoded with the run's tokenizer (``tokenizer_json``); refused when it is
    the training corpus itself (``train_fingerprint``) or cannot be encoded."""
    if tokenizer_json is None:
        raise PlelabError("data.ood needs the run's tokenizer to encode its text, and these token shards came without "
                          "one: pass --tokenizer tokenizer.json (the one the shards were made with), or drop data.ood")
    if ood != OTHER_LIBRARIES and not Path(ood).exists():
        raise PlelabError(f"data.ood={ood} does not exist: give {OTHER_LIBRARIES} or a path to text from outside the "
                          "training corpus")
    corpus = other_libraries_corpus() if ood == OTHER_LIBRARIES else load_corpus(ood, text_field)
    if corpus.fingerprint == train_fingerprint:
        raise PlelabError(f"data.ood={ood} is the training corpus itself: give text from outside it (or "
                          f"{OTHER_LIBRARIES})")
    tok = Tokenizer.from_str(tokenizer_json)
    eos = tok.token_to_id(EOS)
    if eos is None:
        raise PlelabError(f"the run's tokenizer has no {EOS} token to separate data.ood's documents; train one with "
                          "plelab or add it")
    ids, _ = encode_documents(tok, corpus.documents, eos, np.int64)
    if len(ids) < seq_len + 1:
        raise PlelabError(f"data.ood={ood} encodes to {len(ids):,} tokens, fewer than one window of "
                          f"train.seq_len+1={seq_len + 1}; give more text")
    return OODSet(corpus.name, corpus.fingerprint, val_windows(ids, seq_len, max_windows))
