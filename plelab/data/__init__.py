"""Corpora, tokenizer, streaming ingest into token shards, pre-tokenized input, mixtures."""

from plelab.data.corpus import Corpus, embedded_corpus
from plelab.data.mixture import MixtureSampler, parse_mixture, train_sampler
from plelab.data.pipeline import data_summary, ingest, load_data, prepare_token_data
from plelab.data.pretokenized import pretokenized_data
from plelab.data.shards import HashSet64, ShardWriter, TokenStream
from plelab.data.sources import Source, iter_documents, load_corpus, resolve_source, user_corpus
from plelab.data.streaming import ingest_source, prepare_tokens
from plelab.data.tokenizer import EOS, get_tokenizer, load_tokenizer, train_tokenizer
from plelab.data.tokens import (
    PackedSampler,
    TokenData,
    data_val_windows,
    pieces,
    split_documents,
    split_for_training,
    val_windows,
)

prepare_data = prepare_token_data  # the name before issue 55 (one name per concept); kept one release

__all__ = ["EOS", "Corpus", "HashSet64", "MixtureSampler", "PackedSampler", "ShardWriter", "Source", "TokenData",
           "TokenStream", "data_summary", "data_val_windows", "embedded_corpus", "get_tokenizer", "ingest",
           "ingest_source", "iter_documents", "load_corpus", "load_data", "load_tokenizer", "parse_mixture", "pieces",
           "prepare_data", "prepare_token_data", "prepare_tokens", "pretokenized_data", "resolve_source",
           "split_documents", "split_for_training", "train_sampler", "train_tokenizer", "user_corpus", "val_windows"]
