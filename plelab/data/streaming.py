"""Streaming ingest: documents -> dedup -> hash split -> batch tokenisation -> token shards, in bounded memory.

One pass over a source's documents (:func:`plelab.data.sources.iter_documents`), in batches of about
``BATCH_CHARS`` characters. For each document: the corpus fingerprint is updated (sha256 over every
document's length and bytes, in order — the same value :attr:`Corpus.fingerprint` gives); the first 8
bytes of its own sha256 are its 64-bit key, exact duplicates are dropped by key (:class:`HashSet64`,
8 bytes per distinct document; two distinct documents share a key with probability ≈ n²/2⁶⁵), and it
goes to validation iff ``key / 2⁶⁴ < val_fraction``. Each batch's train and validation documents are
encoded with HF ``tokenizers``' batch encoder (its own threads) and appended, each followed by EOS, to
that split's shards (:class:`ShardWriter`). Peak memory: one batch's text and ids, plus the hash set.

A corpus whose documents do not split (too few of them) is split by pieces instead, as
:func:`plelab.data.tokens.split_for_training` does — in memory, since it has few documents.

The result is a folder in the cache, built under a temporary name and renamed when complete (an
interrupted ingest leaves no half-written cache: the next one removes the leftover and starts again),
with a ``manifest.json`` holding the fingerprint, the counts and the shard list. A warm cache is found
by a key over the source's files (path, size, mtime), the tokenizer and the fraction, without reading
the text; ``verify`` re-reads and re-hashes it. An entry is checked each time it is opened, before training: its
manifest's fields, shard names confined to its folder, each shard file's size against its id count, and each
shard's largest id (one vectorised max over the memory map) below the tokenizer's vocabulary; a damaged entry is
refused in one line (:class:`DamagedCache`), and rebuilt under ``verify``. A lock file serialises processes that
ingest the same key (several jobs, or torchrun ranks outside :func:`plelab.data.pipeline.prepare_data`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from plelab.data.corpus import Corpus, corpus_fingerprint, embedded_key
from plelab.data.shards import HashSet64, ShardWriter, open_split, token_dtype
from plelab.data.sources import COMPRESSED, Source, file_kind, iter_documents, source_manifest
from plelab.data.tokenizer import EOS
from plelab.data.tokens import TokenData, split_for_training
from plelab.errors import PlelabError
from plelab.faults import maybe_fault
from plelab.io import cache_dir, naming, os_reason, replace_synced, write_json

INGEST_VERSION = 1  # bump when the shard layout or the split rules change
BATCH_CHARS = 2_000_000  # characters of text per encode batch (≈ 0.5 M tokens)


def source_identity(src: Source) -> dict:
    """What names a source's content without reading it: its files' paths, sizes and mtimes."""
    if src.kind == "embedded":
        return {"embedded": embedded_key(src.embedded)}
    if src.kind == "corpus":
        return {"corpus": src.corpus.fingerprint}
    return {"path": str(src.path.resolve()), "text_field": src.text_field, "files": source_manifest(src)}


def ingest_key(src: Source, tok: Tokenizer, val_fraction: float) -> str:
    tok_hash = hashlib.sha256(tok.to_str().encode()).hexdigest()[:16]
    blob = json.dumps({"v": INGEST_VERSION, "source": source_identity(src), "tokenizer": tok_hash,
                       "val_fraction": val_fraction}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


@contextlib.contextmanager
def cache_lock(name: str):
    """An exclusive lock on ``<cache>/locks/<name>.lock`` for as long as the block runs."""
    path = cache_dir("locks") / f"{name}.lock"
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def encode_documents(tok: Tokenizer, docs: list[str], eos: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, starts)``: the documents' ids back to back, each followed by EOS, and each one's start offset."""
    encs = tok.encode_batch_fast(docs)  # no offsets: the ids are all an ingest keeps
    lens = np.fromiter((len(e.ids) + 1 for e in encs), dtype=np.int64, count=len(encs))
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    ids = np.full(int(lens.sum()), eos, dtype=dtype)
    for s, n, e in zip(starts.tolist(), lens.tolist(), encs):
        ids[s:s + n - 1] = e.ids
    return ids, starts


class _Split:
    """The running state of one pass: fingerprint, dedup set, counts and the two writers."""

    def __init__(self, folder: Path, dtype, val_fraction: float) -> None:
        self.fingerprint, self.seen, self.val_fraction = hashlib.sha256(), HashSet64(), val_fraction
        self.writers = {s: ShardWriter(folder, s, dtype) for s in ("train", "val")}
        self.documents = 0

    def route(self, docs: list[str]) -> dict[str, list[str]]:
        """Fingerprint the batch, drop the duplicates, and split the rest by hash."""
        data = [d.encode("utf-8") for d in docs]
        keys = bytearray()
        for b in data:
            self.fingerprint.update(len(b).to_bytes(8, "little"))
            self.fingerprint.update(b)
            keys += hashlib.sha256(b).digest()[:8]
        self.documents += len(docs)
        keyv = np.frombuffer(bytes(keys), dtype="<u8")
        new = self.seen.add_new(keyv)
        out: dict[str, list[str]] = {"train": [], "val": []}
        for doc, k, fresh in zip(docs, keyv.tolist(), new.tolist()):
            if fresh:
                out["val" if k / 2**64 < self.val_fraction else "train"].append(doc)
        return out


def _batches(documents, chars: int = BATCH_CHARS):
    batch, size = [], 0
    for doc in documents:
        batch.append(doc)
        size += len(doc)
        if size >= chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _progress(total_bytes: int, name: str, show: bool):
    """A bar for ingests that last: it appears after 2 s, so a small corpus prints nothing."""
    return tqdm(total=total_bytes or None, unit="B", unit_scale=True, desc=f"ingest {name}", disable=not show,
                leave=False, delay=2.0)


def _write_all(tmp: Path, tok: Tokenizer, src: Source, val_fraction: float, show: bool) -> dict:
    eos = tok.token_to_id(EOS)
    if eos is None:
        raise PlelabError(f"tokenizer has no {EOS} token; train one with plelab or add it")
    dtype = token_dtype(tok.get_vocab_size())
    state = _Split(tmp, dtype, val_fraction)
    files = source_manifest(src)
    plain = all(file_kind(Path(rel)) in ("text", "jsonl") and not rel.lower().endswith(COMPRESSED)
                for rel, _, _ in files)
    total = sum(size for _, size, _ in files) if plain else 0  # bytes of text, where the files' sizes say it
    with _progress(total, src.name, show) as bar:
        for n, batch in enumerate(_batches(iter_documents(src)), start=1):
            for split, docs in state.route(batch).items():
                if docs:
                    state.writers[split].write_documents(*encode_documents(tok, docs, eos, dtype))
            bar.update(sum(len(d.encode("utf-8")) for d in batch))
            maybe_fault("ingest_batch", n)
    splits = {s: w.close() for s, w in state.writers.items()}
    record = {"fingerprint": state.fingerprint.hexdigest(), "documents": state.documents,
              "duplicates": state.documents - len(state.seen), "pieces": 0, "dtype": dtype.name, "splits": splits}
    if state.documents == 0:
        raise PlelabError(f"data path {src.path or src.name} holds no text (empty files or empty text fields); "
                          "pass non-empty UTF-8 text")
    if splits["train"]["documents"] and splits["val"]["documents"]:
        return record
    # Too few documents to split by hash: split their pieces instead (few documents: in memory).
    for f in tmp.iterdir():
        f.unlink()
    train, val, dups, n_pieces = split_for_training(list(iter_documents(src)), val_fraction)
    for split, docs in (("train", train), ("val", val)):
        writer = ShardWriter(tmp, split, dtype)
        for batch in _batches(docs):
            writer.write_documents(*encode_documents(tok, batch, eos, dtype))
        record["splits"][split] = writer.close()
    record.update(duplicates=dups, pieces=n_pieces)
    return record


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _damage(folder: Path, manifest: dict, vocab: int) -> str | None:
    """Why the cache entry ``folder`` cannot be used as its manifest describes it (None: it can): a field of another
    type, a shard named outside the folder, a shard file of another size than its ids take (cut or rewritten), an
    id beyond the tokenizer's ``vocab`` entries (one vectorised max over each memory-mapped shard)."""
    dtype, splits = manifest.get("dtype"), manifest.get("splits")
    if dtype not in ("uint16", "uint32"):
        return f"its dtype {dtype!r} is neither uint16 nor uint32"
    if not all(isinstance(manifest.get(k), str) for k in ("fingerprint", "name")) or \
            not all(_count(manifest.get(k)) for k in ("duplicates", "pieces")):
        return "its fingerprint, name, duplicates or pieces is missing or of another type"
    for split in ("train", "val"):
        entry = splits.get(split) if isinstance(splits, dict) else None
        if not (isinstance(entry, dict) and isinstance(entry.get("shards"), list) and _count(entry.get("documents"))):
            return f"its {split} split is not a list of shards with a document count"
        for shard in entry["shards"]:
            name, tokens = (shard.get("file"), shard.get("tokens")) if isinstance(shard, dict) else (shard, None)
            if not isinstance(name, str) or not re.fullmatch(rf"{split}-\d{{5,}}\.bin", name):
                return f"it names a shard {str(name)[:60]!r}, not a {split}-NNNNN.bin file of the cache folder"
            if not _count(tokens):
                return f"its shard {name} has a token count {str(tokens)[:40]!r}, not an integer >= 0"
            try:
                size = (folder / name).stat().st_size
            except OSError as err:
                return f"its shard {name} cannot be read ({os_reason(err)})"
            if size != tokens * np.dtype(dtype).itemsize:
                return (f"its shard {name} has {size:,} bytes where the {tokens:,} {dtype} ids of its manifest take "
                        f"{tokens * np.dtype(dtype).itemsize:,} (cut or rewritten)")
            top = open_split(folder, {"shards": [shard]}, dtype).max()
            if top >= vocab:
                return f"its shard {name} holds id {top:,}, beyond the tokenizer's {vocab:,} entries"
    return None


class DamagedCache(PlelabError):
    """A cache entry whose files disagree with its manifest, or hold ids its tokenizer cannot have made."""

    def __init__(self, folder: Path, why: str) -> None:
        self.why = f"ingest cache entry {folder} is damaged: {why}"
        super().__init__(f"{self.why}; run plelab ingest --verify with the same --data and flags to rebuild it, or "
                         "delete that folder")


def _load(folder: Path, manifest: dict, tok: Tokenizer) -> TokenData:
    """The entry's token data, after :func:`_damage` found nothing wrong (else :class:`DamagedCache`, before any
    shard is memory-mapped for training)."""
    why = _damage(folder, manifest, tok.get_vocab_size())
    if why is not None:
        raise DamagedCache(folder, why)
    tr, va = manifest["splits"]["train"], manifest["splits"]["val"]
    return TokenData(open_split(folder, tr, manifest["dtype"]), open_split(folder, va, manifest["dtype"]),
                     manifest["fingerprint"], manifest["name"], tr["documents"], va["documents"],
                     manifest["duplicates"], tok.to_str(), manifest["pieces"],
                     unit="pieces" if manifest["pieces"] else "documents", location=str(folder))


def _read_manifest(folder: Path) -> dict | None:
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("version") == INGEST_VERSION else None


class NotReady(PlelabError):
    """``build=False`` and the cache does not hold what was asked for (``plelab ingest --check``)."""


def _discard(folder: Path) -> None:
    """Remove a cache entry so that no kill leaves half of it: renamed away first (one atomic step), then deleted."""
    if folder.exists():
        gone = folder.parent / f".{folder.name}.old-{os.getpid()}"
        os.replace(folder, gone)
        shutil.rmtree(gone, ignore_errors=True)


def ingest_source(src: Source, tok: Tokenizer, val_fraction: float, progress: bool = True, verify: bool = False,
                  log=print, build: bool = True) -> TokenData:
    """The token shards of ``src`` under ``tok``: from the cache when its key matches, else built (atomically).

    With ``verify`` a cached entry is trusted only if re-reading the text gives its fingerprint; if not (files
    rewritten with their old size and mtime) the entry is rebuilt, and ``log`` says so. With ``build=False``
    nothing is built or removed: :class:`NotReady` if the entry is missing or fails ``verify``."""
    key = ingest_key(src, tok, val_fraction)
    folder = cache_dir("ingest") / key
    with cache_lock(f"ingest-{key}"):
        manifest = _read_manifest(folder)
        if manifest is not None and verify:
            try:
                _load(folder, manifest, tok)
            except DamagedCache as err:
                if not build:
                    raise NotReady(f"--verify: {err}") from None
                log(f"--verify: {err.why}; ingesting it again")
                manifest = None
        if manifest is not None and verify:
            now = corpus_fingerprint(iter_documents(src))
            if now != manifest["fingerprint"]:
                if not build:
                    raise NotReady(f"--verify: {src.name} changed without changing size or mtime (sha256 {now[:12]}…, "
                                   f"cached {manifest['fingerprint'][:12]}…); run plelab ingest --verify to re-ingest")
                log(f"--verify: {src.name} changed without changing size or mtime (sha256 {now[:12]}…, cached "
                    f"{manifest['fingerprint'][:12]}…); ingesting it again")
                manifest = None
        if manifest is None and not build:
            raise NotReady(f"{src.name} is not ingested yet (for this tokenizer and data.val_fraction="
                           f"{val_fraction}); run plelab ingest with the same flags")
        if manifest is None:
            for stale in [*folder.parent.glob(f".{key}.tmp-*"), *folder.parent.glob(f".{key}.old-*")]:
                shutil.rmtree(stale, ignore_errors=True)  # left by an interrupted ingest
            _discard(folder)
            tmp = folder.parent / f".{key}.tmp-{os.getpid()}"
            tmp.mkdir()
            try:
                manifest = {"version": INGEST_VERSION, "name": src.name, "source": source_identity(src),
                            **_write_all(tmp, tok, src, val_fraction, progress)}
                with naming(tmp / "tokenizer.json"):
                    (tmp / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
                write_json(tmp / "manifest.json", manifest)
                replace_synced(tmp, folder)  # synced: no power loss leaves a named entry with empty shards
            except OSError as err:
                if not str(err.filename or "").startswith(str(tmp)):
                    raise  # not a write of the entry (reading the source, say): it names its own file
                raise PlelabError(f"cannot write ingest cache entry {folder} ({Path(err.filename).name}: "
                                  f"{os_reason(err)}); free space in {folder.parent} or set PLELAB_CACHE to a folder "
                                  "with room, then rerun (nothing was left half-written)") from None
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return _load(folder, manifest, tok)  # checked and mapped under the lock: no rebuild can swap it meanwhile


def prepare_tokens(corpus: Corpus, tok: Tokenizer, val_fraction: float, progress: bool = False) -> TokenData:
    """An in-memory corpus through the same ingest (split, tokenise once, cache, memory-map)."""
    return ingest_source(Source(None, "corpus", corpus=corpus), tok, val_fraction, progress=progress)


__all__ = ["BATCH_CHARS", "NotReady", "cache_lock", "ingest_key", "ingest_source", "prepare_tokens", "source_identity"]
