"""Corpora, tokenizer and token streams."""

from plelab.data.corpus import Corpus, embedded_corpus, load_corpus, text_corpus
from plelab.data.tokenizer import EOS, get_tokenizer, load_tokenizer, train_tokenizer
from plelab.data.tokens import TokenData, prepare_tokens, split_documents, train_batch, val_windows

__all__ = ["EOS", "Corpus", "TokenData", "embedded_corpus", "get_tokenizer", "load_corpus", "load_tokenizer",
           "prepare_tokens", "split_documents", "text_corpus", "train_batch", "train_tokenizer", "val_windows"]
