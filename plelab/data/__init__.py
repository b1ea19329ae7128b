"""Corpora, tokenizer and token streams."""

from plelab.data.corpus import Corpus, embedded_corpus
from plelab.data.sources import load_corpus, user_corpus
from plelab.data.tokenizer import EOS, get_tokenizer, load_tokenizer, train_tokenizer
from plelab.data.tokens import PackedSampler, TokenData, prepare_tokens, split_documents, val_windows

__all__ = ["EOS", "Corpus", "TokenData", "embedded_corpus", "get_tokenizer", "load_corpus", "load_tokenizer",
           "PackedSampler", "prepare_tokens", "split_documents", "user_corpus", "train_tokenizer", "val_windows"]
