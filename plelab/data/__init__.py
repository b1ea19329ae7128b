"""Corpora, tokenizer and token streams."""

from plelab.data.corpus import Corpus, embedded_corpus
from plelab.data.sources import load_corpus, user_corpus
from plelab.data.tokenizer import EOS, get_tokenizer, load_tokenizer, train_tokenizer
from plelab.data.tokens import (
    PackedSampler,
    TokenData,
    pieces,
    prepare_tokens,
    split_documents,
    split_for_training,
    val_windows,
)

__all__ = ["EOS", "Corpus", "TokenData", "embedded_corpus", "get_tokenizer", "load_corpus", "load_tokenizer",
           "PackedSampler", "pieces", "prepare_tokens", "split_documents", "split_for_training", "user_corpus",
           "train_tokenizer", "val_windows"]
