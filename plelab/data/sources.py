"""Users' own text, streamed: plain text, JSONL (also ``.gz`` / ``.zst``), Parquet by row group, HF ``datasets``
folders.

A source is resolved once (:func:`resolve_source`: which files, of which kind) and then read as a
stream of documents (:func:`iter_documents`) in bounded memory: text files in blocks, JSONL line
by line through the decompressor (:mod:`plelab.data.jsonl`; archives read to a verified end), Parquet one
record batch at a time, a ``save_to_disk`` folder through its memory-mapped Arrow files (the text column of
either must be string-typed, in every file: a binary or integer column is refused, not skipped). :func:`source_manifest` lists (path, size, mtime) without
reading anything, so a warm cache is recognised without re-reading the text.

Bad inputs (missing, empty, binary, non-UTF-8, unreadable, malformed JSON, a corrupt archive, a
missing text field, a folder mixing text with token shards) raise a one-line
:class:`~plelab.errors.PlelabError` naming the file and the fix.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from plelab.data.archives import blocks
from plelab.data.corpus import Corpus, embedded_corpus, embedded_name
from plelab.data.jsonl import jsonl_documents
from plelab.errors import PlelabError
from plelab.io import os_reason

TEXT_SUFFIXES = (".txt", ".md", ".text")
COMPRESSED = (".gz", ".zst")
TOKEN_SUFFIXES = (".bin", ".npy")  # pre-tokenized shards (plelab.data.pretokenized)
READABLE_SUFFIXES = (*TEXT_SUFFIXES, ".jsonl", ".parquet")
# Suffixes of formats that would otherwise be read as plain text (any other suffix is: .log, .rst, none, ...).
UNSUPPORTED = (".json", ".csv", ".tsv", ".gz", ".zst", ".bz2", ".xz", ".zip", ".tar", ".pt", ".pkl", ".arrow",
               ".npz", ".safetensors")
MAX_PARAGRAPH = 4 << 20  # a "paragraph" with no blank line for this many characters is cut here


@dataclass(frozen=True)
class Source:
    """One resolved data path. ``kind``: ``embedded`` | ``files`` (text / JSONL / Parquet) | ``hf`` | ``tokens``, or
    ``corpus`` (documents already in memory)."""

    path: Path | None
    kind: str
    files: tuple[Path, ...] = ()
    text_field: str = "text"
    corpus: Corpus | None = None
    embedded: str = "stdlib"  # which embedded corpus (data.embedded), for kind "embedded"

    @property
    def name(self) -> str:
        if self.corpus is not None:
            return self.corpus.name
        return embedded_name(self.embedded) if self.path is None else self.path.name


def file_kind(path: Path) -> str | None:
    """``text`` | ``jsonl`` | ``parquet`` | ``tokens`` by name (compression suffixes looked through), else None."""
    name = path.name.lower()
    for comp in COMPRESSED:
        if name.endswith(comp):
            name = name[:-len(comp)]
            break
    if name.endswith(".jsonl"):
        return "jsonl"
    if name.endswith(".parquet") and name == path.name.lower():
        return "parquet"
    if name.endswith(TEXT_SUFFIXES):
        return "text"
    if name.endswith(TOKEN_SUFFIXES) and name == path.name.lower():
        return "tokens"
    return None


def _is_hf_dataset_dir(path: Path) -> bool:
    return (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()


def folder_files(folder: Path) -> list[Path]:
    """The files below ``folder`` whose names do not start with '.', sorted. Linked sub-folders are followed, each real
    folder once: one reached again (a link loop, or a second link to a folder already read) is refused, as is a link
    to nothing that may have held data — a name that would be read, or one without a suffix (a folder) — whose text
    would otherwise be missing without a word."""
    seen: dict[tuple[int, int], Path] = {}
    found, todo = [], [folder]
    while todo:
        here = todo.pop()
        try:
            st = here.stat()
            if (st.st_dev, st.st_ino) in seen:
                first = seen[(st.st_dev, st.st_ino)]
                raise PlelabError(f"data folder {folder}: {here.relative_to(folder)} and "
                                  f"{'the data folder itself' if first == folder else first.relative_to(folder)} "
                                  "are one folder (a link loop, or two links to one folder: its files would be read "
                                  "twice); remove the link")
            seen[(st.st_dev, st.st_ino)] = here
            entries = sorted(os.scandir(here), key=lambda e: e.name, reverse=True)  # popped in name order
        except OSError as err:
            raise PlelabError(f"cannot read data folder {here}: {os_reason(err)}; check the folder and its links") \
                from None
        for entry in entries:
            path = Path(entry.path)
            try:
                is_dir, is_file = entry.is_dir(), entry.is_file()
            except OSError:  # a link to itself (ELOOP): like a link to nothing
                is_dir = is_file = False
            hidden = entry.name.startswith(".")
            if is_dir:
                todo.append(path)
            elif is_file and not hidden:
                found.append(path)
            elif not is_file and entry.is_symlink() and not hidden and (file_kind(path) or not path.suffix):
                raise PlelabError(f"data folder {folder}: {path.relative_to(folder)} is a link to "
                                  f"{os.readlink(path)}, which does not exist; restore its target or remove the link")
    return sorted(found)


def resolve_source(path: str | os.PathLike | None, text_field: str = "text", embedded: str = "stdlib") -> Source:
    """Which files ``path`` names and what they hold; ``None`` is the ``embedded`` corpus (``stdlib`` |
    ``packages``). A folder is read recursively in sorted order, linked sub-folders too (:func:`folder_files`); it
    may hold text formats or token shards, not both."""
    if path is None:
        embedded_name(embedded)  # an unknown name is refused here, before anything is read
        return Source(None, "embedded", text_field=text_field, embedded=embedded)
    p = Path(path)
    if not p.exists():
        raise PlelabError(f"data path {p} does not exist; pass a text/JSONL/Parquet file, token shards or a folder")
    if not p.is_file() and not p.is_dir():
        raise PlelabError(f"data path {p} is a device, pipe or socket, not a file or folder; pass a text/JSONL/Parquet "
                          "file, token shards or a folder")
    if p.is_file():
        if file_kind(p) is None and p.name.lower().endswith(UNSUPPORTED):
            raise PlelabError(f"{p} is not a format plelab reads: give text (.txt/.md), JSONL (.jsonl, .jsonl.gz, "
                              ".jsonl.zst), Parquet, a HF datasets folder, or token shards (.bin/.npy)")
        return Source(p, "tokens" if file_kind(p) == "tokens" else "files", (p,), text_field)
    if _is_hf_dataset_dir(p):
        return Source(p, "hf", tuple(sorted(f for f in p.rglob("*") if f.is_file())), text_field)
    found = folder_files(p)
    text = [f for f in found if file_kind(f) in ("text", "jsonl", "parquet")]
    tokens = [f for f in found if file_kind(f) == "tokens"]
    if text and tokens:
        raise PlelabError(f"data folder {p} mixes text files ({text[0].name}) with token shards ({tokens[0].name}); "
                          "give each its own folder (a mixture takes several --data PATH:WEIGHT)")
    if not text and not tokens:
        raise PlelabError(f"data folder {p} has no {'/'.join(READABLE_SUFFIXES)} files (plain, .gz or .zst) "
                          "and no .bin/.npy token shards")
    return Source(p, "tokens" if tokens else "files", tuple(tokens or text), text_field)


def source_manifest(src: Source) -> list[list]:
    """``[[relative path, size, mtime_ns], ...]`` of the source's files: what a warm cache is recognised by."""
    if src.kind in ("embedded", "corpus"):
        return []
    out = []
    for f in src.files:
        st = f.stat()
        rel = f.name if f == src.path else str(f.relative_to(src.path))
        out.append([rel, st.st_size, st.st_mtime_ns])
    return out


def _text_blocks(path: Path) -> Iterator[str]:
    """UTF-8 text of ``path`` in blocks, ``\\r\\n`` and ``\\r`` turned into ``\\n``; NUL bytes near the start mean
    binary."""
    decoder, offset, first, carry = codecs.getincrementaldecoder("utf-8")(), 0, True, ""
    for block in blocks(path):
        if first and b"\x00" in block[:65536]:
            raise PlelabError(f"{path} looks binary (it contains NUL bytes); pass UTF-8 text")
        first = False
        held = len(decoder.getstate()[0])  # bytes of a character the previous block ended inside
        try:
            text = decoder.decode(block)
        except UnicodeDecodeError as err:
            raise PlelabError(f"{path} is not UTF-8 (invalid byte at offset {offset - held + err.start}); "
                              "convert it to UTF-8") from None
        offset += len(block)
        text = carry + text
        carry = "\r" if text.endswith("\r") else ""
        yield (text[:-1] if carry else text).replace("\r\n", "\n").replace("\r", "\n")
    held = len(decoder.getstate()[0])
    try:
        tail = decoder.decode(b"", final=True)
    except UnicodeDecodeError as err:
        raise PlelabError(f"{path} is not UTF-8 (invalid byte at offset {offset - held + err.start}); "
                          "convert it to UTF-8") from None
    if carry or tail:
        yield (carry + tail).replace("\r\n", "\n").replace("\r", "\n")


LONG_LINE = 16  # a line longer than this many documents' worth (min_chars) is cut, e.g. a file on one line


def _cut_line(line: str, size: int):
    """``line`` in pieces of about ``size`` characters, cut at a space where one is near (else anywhere)."""
    while len(line) > size:
        cut = line.rfind(" ", size // 2, size)
        cut = size if cut <= 0 else cut
        yield line[:cut]
        line = line[cut:]
    yield line


def _paragraph_pieces(para: str, min_chars: int):
    """A paragraph longer than ``min_chars`` (e.g. one sentence per line, no blank lines) cut at line ends, and a
    huge line (a whole file without line breaks) at spaces, so that it still gives many documents."""
    if len(para) <= min_chars:
        yield para
        return
    buf, size = [], 0
    lines = para.split("\n")
    if any(len(line) > LONG_LINE * min_chars for line in lines):
        lines = [piece for line in lines for piece in
                 (_cut_line(line, min_chars) if len(line) > LONG_LINE * min_chars else (line,))]
    for line in lines:
        buf.append(line)
        size += len(line) + 1
        if size >= min_chars:
            yield "\n".join(buf)
            buf, size = [], 0
    if buf:
        yield "\n".join(buf)


def _paragraphs(blocks) -> Iterator[str]:
    """Blank-line-separated paragraphs of a stream of text blocks (a paragraph is cut at MAX_PARAGRAPH characters)."""
    pending = ""
    for block in blocks:
        parts = (pending + block).split("\n\n")
        pending = parts.pop()
        for part in parts:
            yield from _cut(part)
        while len(pending) > MAX_PARAGRAPH:
            yield pending[:MAX_PARAGRAPH]
            pending = pending[MAX_PARAGRAPH:]
    yield from _cut(pending)


def _cut(paragraph: str):
    """A paragraph in pieces of at most MAX_PARAGRAPH characters (wherever the blocks fell)."""
    for i in range(0, max(len(paragraph), 1), MAX_PARAGRAPH):
        yield paragraph[i:i + MAX_PARAGRAPH]


def chunk_paragraphs(text, min_chars: int = 2000) -> Iterator[str]:
    """Consecutive paragraphs of ``text`` (a string, or an iterable of text blocks) grouped into documents of
    >= ``min_chars``, so that one long file still gives a validation split drawn from all of it."""
    buf, size = [], 0
    for para in _paragraphs([text] if isinstance(text, str) else text):
        for piece in _paragraph_pieces(para, min_chars):
            piece = piece.strip()
            if not piece:
                continue
            buf.append(piece)
            size += len(piece)
            if size >= min_chars:
                yield "\n\n".join(buf)
                buf, size = [], 0
    if buf:
        yield "\n\n".join(buf)


def _string_column(path: Path, field: str, kind, strings: list[str]) -> None:
    """Refuse a text column ``field`` of another type than string (``kind``, as Arrow or datasets names it): its
    values would be skipped, and the file would drop out of the corpus without a word."""
    hint = (f"its string columns: {', '.join(strings)} — choose one with --text-field" if strings else
            "it has no string column — store the text as UTF-8 strings")
    raise PlelabError(f"{path}: column {field!r} is {kind}, not string; plelab reads text from a string column "
                      f"({hint})")


def _parquet_documents(path: Path, text_field: str) -> Iterator[str]:
    try:
        import pyarrow as pa  # optional: the data extra, for users' Parquet files (the column types)
        import pyarrow.parquet as pq  # optional: the data extra, for users' Parquet files
    except ImportError:
        raise PlelabError(f"reading {path} needs pyarrow: pip install pyarrow") from None
    try:
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
    except Exception as err:  # pyarrow raises ArrowInvalid / OSError for damaged files
        raise PlelabError(f"cannot read Parquet file {path}: {str(err).splitlines()[0]}") from None
    if text_field not in schema.names:
        raise PlelabError(f"{path} has no column {text_field!r} (columns: {', '.join(schema.names)}); "
                          "choose the text column with --text-field")

    def is_text(kind) -> bool:
        kind = kind.value_type if pa.types.is_dictionary(kind) else kind
        return pa.types.is_string(kind) or pa.types.is_large_string(kind) or str(kind) == "string_view"

    if not is_text(schema.field(text_field).type):
        _string_column(path, text_field, schema.field(text_field).type, [f.name for f in schema if is_text(f.type)])
    batches = pf.iter_batches(batch_size=4096, columns=[text_field])
    while True:
        try:
            batch = next(batches, None)
        except Exception as err:
            raise PlelabError(f"cannot read Parquet file {path}: {str(err).splitlines()[0]}") from None
        if batch is None:
            return
        yield from (t.strip() for t in batch.column(0).to_pylist() if isinstance(t, str) and t.strip())


def _hf_documents(path: Path, text_field: str) -> Iterator[str]:
    """A folder written by ``datasets.Dataset.save_to_disk`` (a DatasetDict uses its ``train`` split)."""
    try:
        import datasets  # optional: the data extra, for users' HF datasets folders
    except ImportError:
        raise PlelabError(f"{path} is a HF datasets folder; reading it needs: pip install datasets") from None
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as err:
        raise PlelabError(f"cannot load HF dataset folder {path}: {str(err).splitlines()[0]}") from None
    if isinstance(ds, datasets.DatasetDict):
        ds = ds["train"] if "train" in ds else ds[sorted(ds)[0]]
    if text_field not in ds.column_names:
        raise PlelabError(f"dataset {path} has no column {text_field!r} (columns: {', '.join(ds.column_names)}); "
                          "choose one with --text-field")

    def is_text(feature) -> bool:
        return getattr(feature, "dtype", None) in ("string", "large_string")

    if not is_text(ds.features[text_field]):
        _string_column(path, text_field, ds.features[text_field],
                       [n for n, f in ds.features.items() if is_text(f)])
    for batch in ds.select_columns([text_field]).iter(batch_size=4096):
        yield from (t.strip() for t in batch[text_field] if isinstance(t, str) and t.strip())


def file_documents(path: Path, text_field: str = "text") -> Iterator[str]:
    kind = file_kind(path)
    if kind == "jsonl":
        return jsonl_documents(path, text_field)
    if kind == "parquet":
        return _parquet_documents(path, text_field)
    return chunk_paragraphs(_text_blocks(path))


def iter_documents(src: Source) -> Iterator[str]:
    """The source's documents in order, streamed (the embedded corpus from its cached extraction)."""
    if src.kind == "embedded":
        yield from embedded_corpus(src.embedded).documents
    elif src.kind == "corpus":
        yield from src.corpus.documents
    elif src.kind == "hf":
        yield from _hf_documents(src.path, src.text_field)
    elif src.kind == "tokens":
        raise PlelabError(f"{src.path} holds token ids, not text; it is read as pre-tokenized shards")
    else:
        for f in src.files:
            yield from file_documents(f, src.text_field)


def user_corpus(path: str | os.PathLike, text_field: str = "text") -> Corpus:
    """Read a text source into memory (small data: the diagnostics' ``--data``, tests). Training streams instead."""
    src = resolve_source(path, text_field)
    docs = list(iter_documents(src))
    if not docs:
        raise PlelabError(f"data path {src.path} holds no text (empty files or empty text fields); "
                          "pass non-empty UTF-8 text")
    return Corpus(name=src.name, documents=docs)


def load_corpus(path: str | None, text_field: str = "text", embedded: str = "stdlib") -> Corpus:
    """``None`` -> the ``embedded`` corpus (``stdlib`` | ``packages``); otherwise the user's data at ``path`` (in
    memory)."""
    return embedded_corpus(embedded) if path is None else user_corpus(path, text_field)
