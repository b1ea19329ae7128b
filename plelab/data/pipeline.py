"""From a config to token streams: sources -> tokenizer -> token shards (cached, memory-mapped) -> one or a mixture.

- Text sources are streamed into shards by :func:`plelab.data.streaming.ingest_source`; pre-tokenized ones
  (``.bin``/``.npy``) are memory-mapped where they lie (:func:`plelab.data.pretokenized.pretokenized_data`).
- The tokenizer: ``data.tokenizer`` if given; else a byte-level BPE trained on a bounded sample of the
  text (:func:`plelab.data.tokenizer.hash_sample`; a mixture samples each source by its weight),
  indexed by the sources' (path, size, mtime) so that a warm run finds it without reading any text.
  Token shards without a tokenizer take their vocabulary from ``model.vocab_size``.
- Under torchrun, rank 0 does the work first (training the tokenizer, writing the shards) while the
  other ranks wait; they then read the same cached files. Separate processes are serialised by the
  cache's lock files.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

from tokenizers import Tokenizer

from plelab.config.schema import DataConfig, RunConfig
from plelab.data.corpus import corpus_fingerprint
from plelab.data.mixture import parse_mixture
from plelab.data.pretokenized import pretokenized_data
from plelab.data.shards import TokenStream
from plelab.data.sources import Source, file_kind, iter_documents, resolve_source
from plelab.data.streaming import NotReady, cache_lock, ingest_source, source_identity
from plelab.data.tokenizer import check_fits, hash_sample, load_tokenizer, sampled_tokenizer
from plelab.data.tokens import TokenData
from plelab.distributed import DistInfo, all_ranks_ok
from plelab.errors import PlelabError
from plelab.io import atomic_write, cache_dir


def data_sources(data: DataConfig) -> list[tuple[Source, float]]:
    """The configured sources and their weights (one source: weight 1). A ``data.text_field`` other than the
    default where no source has fields (text files, token shards, the embedded corpus) is refused: it would be
    accepted without effect."""
    entries = parse_mixture(data.mix) if data.mix else [(data.path, 1.0)]
    sources = [(resolve_source(p, data.text_field, data.embedded), w) for p, w in entries]
    _refuse_shared_files([src for src, _ in sources])
    if data.text_field != "text" and not any(_has_fields(src) for src, _ in sources):
        kinds = sorted({"token shards" if src.kind == "tokens" else "the embedded corpus" if src.kind == "embedded"
                        else "text files (.txt/.md)" for src, _ in sources})
        raise PlelabError(f"data.text_field={data.text_field!r} names a JSONL field or a Parquet / HF datasets column, "
                          f"but the data is {' and '.join(kinds)}, which have none: drop --text-field "
                          "(a text file's documents are its blank-line-separated paragraphs, grouped)")
    return sources


def _refuse_shared_files(sources: list[Source]) -> None:
    """Refuse a mixture two of whose sources read one file: the same file or folder under two names (a link, or
    ``a.jsonl`` beside ``./a.jsonl``), or a file inside a folder that is a source too — its documents would be
    weighted twice and its validation split would overlap the other's training split."""
    seen: dict[str, Source] = {}
    for src in sources:
        held = src.files or ((src.path,) if src.path is not None else ())
        for f in held:
            real = os.path.realpath(f)
            other = seen.setdefault(real, src)
            if other is not src:
                what = ("are one file or folder (through a link)" if os.path.realpath(other.path) ==
                        os.path.realpath(src.path) else f"both hold {real}")
                raise PlelabError(f"mixture sources {other.path} and {src.path} {what}: its documents would be read "
                                  "twice; give each file once")


def _has_fields(src: Source) -> bool:
    """Whether ``src`` reads its text from a field or column (JSONL, Parquet, an HF datasets folder)."""
    return src.kind == "hf" or src.kind == "files" and any(file_kind(f) in ("jsonl", "parquet") for f in src.files)


def _text_sample(sources: list[tuple[Source, float]], sample_chars: int) -> list[str]:
    """The tokenizer sample: each text source's :func:`hash_sample` of its weight's share of ``sample_chars``."""
    return [d for src, w in sources for d in hash_sample(iter_documents(src), int(sample_chars * w))]


def resolve_tokenizer(data: DataConfig, sources: list[tuple[Source, float]], vocab_size: int,
                      progress: bool = True, build: bool = True, verify: bool = False) -> Tokenizer | None:
    """The run's tokenizer (see the module docstring); None for token shards without one. ``verify``: re-hash the
    sample a cached tokenizer was trained on, and retrain it if that changed."""
    if data.tokenizer is not None:
        return check_fits(load_tokenizer(data.tokenizer), vocab_size)
    text = [(s, w) for s, w in sources if s.kind != "tokens"]
    if not text:
        return None
    if len(text) < len(sources):
        raise PlelabError("a mixture of text and token shards needs the tokenizer the shards were made with: "
                          "pass --tokenizer tokenizer.json")
    key = hashlib.sha256(json.dumps([[source_identity(s), w] for s, w in text] + [vocab_size,
                                     data.tokenizer_sample_chars], sort_keys=True).encode()).hexdigest()[:20]
    index = cache_dir("tokenizers", "by-source") / f"{key}.json"
    sample_file = index.with_suffix(".sample")  # the sample's fingerprint, for verify
    total = sum(w for _, w in text)
    with cache_lock(f"tokenizer-{key}"):  # another process may be training it: wait, then take its file
        sample = None
        if index.exists() and verify:
            sample = _text_sample([(s, w / total) for s, w in text], data.tokenizer_sample_chars)
            if not sample_file.exists() or sample_file.read_text().strip() != corpus_fingerprint(sample):
                if not build:
                    raise NotReady("--verify: the tokenizer's sample changed without changing size or mtime; run "
                                   "plelab ingest --verify to retrain it")
                index.unlink()
        if index.exists():
            return check_fits(load_tokenizer(index), vocab_size)
        if not build:
            raise NotReady(f"no tokenizer has been trained for {', '.join(s.name for s, _ in text)} yet; run plelab "
                           "ingest with the same flags")
        if sample is None:
            sample = _text_sample([(s, w / total) for s, w in text], data.tokenizer_sample_chars)
        if not sample:
            names = ", ".join(str(s.path or s.name) for s, _ in text)
            raise PlelabError(f"data path {names} holds no text (empty files or empty text fields); "
                              "pass non-empty UTF-8 text")
        tok = sampled_tokenizer(sample, vocab_size, progress)
        atomic_write(sample_file, lambda p: p.write_text(corpus_fingerprint(sample)))
        atomic_write(index, lambda p: tok.save(str(p)))
    return tok


def _combine(parts: list[TokenData], weights: list[float]) -> TokenData:
    """One :class:`TokenData` for a mixture: the streams concatenated, the sources and weights kept for sampling."""
    fp = hashlib.sha256(json.dumps([[d.corpus_fingerprint, w] for d, w in zip(parts, weights)]).encode()).hexdigest()
    def cat(streams):
        return TokenStream([p for s in streams for p in (s.parts if isinstance(s, TokenStream) else [s])])
    return TokenData(cat(d.train for d in parts), cat(d.val for d in parts), fp, "+".join(d.corpus_name for d in parts),
                     sum(d.n_train_docs for d in parts), sum(d.n_val_docs for d in parts),
                     sum(d.n_duplicates for d in parts), parts[0].tokenizer_json, sum(d.n_pieces for d in parts),
                     unit="documents" if len({d.unit for d in parts}) > 1 else parts[0].unit,
                     mixture=[(d.corpus_name, d.train, w) for d, w in zip(parts, weights)],
                     val_mixture=[(d.corpus_name, d.val, w) for d, w in zip(parts, weights)],
                     location=[d.location for d in parts])


def load_data(data: DataConfig, vocab_size: int, progress: bool = True, verify: bool = False,
              log=print, build: bool = True, min_block: int = 1) -> TokenData:
    """Token data for a data config, in this process (no torchrun coordination: see :func:`prepare_token_data`).
    ``verify``: re-hash cached text and re-scan token shards; ``build=False``: only what the cache holds, else
    :class:`NotReady`; ``min_block``: the smallest validation block of token shards (a run's ``seq_len + 1``)."""
    sources = data_sources(data)
    tokens = [s for s, _ in sources if s.kind == "tokens"]
    for key, value in (("data.token_dtype", data.token_dtype), ("data.val_shard", data.val_shard)):
        if value is not None and not tokens:
            raise PlelabError(f"{key} applies to pre-tokenized shards (.bin/.npy), and the data is text; drop {key}")
    if data.val_shard is not None and len(tokens) > 1:
        raise PlelabError("data.val_shard names one shard, and the mixture has several token sources; hold out "
                          "blocks instead (drop data.val_shard)")
    tok = resolve_tokenizer(data, sources, vocab_size, progress, build, verify)
    parts = []
    for src, _ in sources:
        if src.kind == "tokens":
            parts.append(pretokenized_data(src, vocab_size, tok, data.val_fraction, data.token_dtype, data.val_shard,
                                           rescan=verify, min_block=min_block))
        else:
            parts.append(ingest_source(src, tok, data.val_fraction, progress=progress, verify=verify, log=log,
                                       build=build))
    return parts[0] if len(parts) == 1 else _combine(parts, [w for _, w in sources])


def data_summary(data: TokenData) -> dict:
    """What ``plelab ingest`` reports about prepared data."""
    split = (f"{data.n_pieces:,} pieces of too few documents" if data.n_pieces else
             f"{data.n_train_docs:,} train / {data.n_val_docs:,} validation {data.unit}")
    if data.n_duplicates:
        split += f", {data.n_duplicates:,} duplicates removed"
    out = {"name": data.corpus_name, "fingerprint": data.corpus_fingerprint, "train_tokens": len(data.train),
           "val_tokens": len(data.val), "dtype": str(data.train.dtype), "split": split, "location": data.location,
           "n_train": data.n_train_docs, "n_val": data.n_val_docs, "unit": data.unit, "duplicates": data.n_duplicates}
    if data.mixture:
        out["mixture"] = [{"name": n, "train_tokens": len(s), "weight": w} for n, s, w in data.mixture]
        out["location"] = "; ".join(f"{n}: {d}" for n, d in zip((n for n, _, _ in data.mixture), data.location or []))
    return out


def ingest(cfg: RunConfig, progress: bool = True, verify: bool = False, check: bool = False, dist=None) -> dict:
    """What ``plelab ingest`` does: prepare the data of ``cfg`` (with ``check``, only look it up: :class:`NotReady`
    if something is missing) and return its :func:`data_summary`, with the seconds it took."""
    t0 = time.perf_counter()
    data = prepare_token_data(cfg, progress=progress, dist=dist, verify=verify, build=not check)
    return {**data_summary(data), "seconds": round(time.perf_counter() - t0, 3)}


def prepare_token_data(cfg: RunConfig, progress: bool = True, dist=None, verify: bool = False,
                 build: bool = True) -> TokenData:
    """:func:`load_data` for a run config, coordinated under torchrun (rank 0 first, the others then read)."""
    dist = dist or DistInfo()

    def run() -> TokenData:  # verify on rank 0 only: the others read what it checked
        return load_data(cfg.data, cfg.model.vocab_size, progress=progress and dist.is_main,
                         verify=verify and dist.is_main, build=build, min_block=cfg.train.seq_len + 1)

    if dist.is_main:
        try:
            data = run()
        except PlelabError:
            all_ranks_ok(False, dist)  # release the other ranks, then report here
            raise
        all_ranks_ok(True, dist)
        return data
    if not all_ranks_ok(True, dist):
        raise PlelabError("rank 0 could not prepare the data (its message says why)")
    return run()
