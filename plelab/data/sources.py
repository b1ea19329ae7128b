"""Users' own text: plain-text files or folders, JSONL, Parquet, or a local HF ``datasets`` folder.

Every reader returns a :class:`~plelab.data.corpus.Corpus`. Bad inputs (missing, empty,
binary, non-UTF-8, unreadable, malformed JSON, missing text field) raise a one-line
:class:`~plelab.errors.PlelabError` that names the file and the problem.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from plelab.data.corpus import Corpus, embedded_corpus
from plelab.errors import PlelabError

TEXT_SUFFIXES = (".txt", ".md", ".text")
READABLE_SUFFIXES = (*TEXT_SUFFIXES, ".jsonl", ".parquet")


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except IsADirectoryError:
        raise PlelabError(f"{path} is a folder where a file was expected") from None
    except OSError as err:
        raise PlelabError(f"cannot read {path}: {err.strerror or err}; check the path and its permissions") from None


def _decode(path: Path, data: bytes) -> str:
    if b"\x00" in data[:65536]:
        raise PlelabError(f"{path} looks binary (it contains NUL bytes); pass UTF-8 text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise PlelabError(f"{path} is not UTF-8 (invalid byte at offset {err.start}); convert it to UTF-8") from None


LONG_LINE = 16  # a line longer than this many documents' worth (min_chars) is cut, e.g. a file on one line


def _cut_line(line: str, size: int):
    """``line`` in pieces of about ``size`` characters, cut at a space where one is near (else anywhere)."""
    while len(line) > size:
        cut = line.rfind(" ", size // 2, size)
        cut = size if cut <= 0 else cut
        yield line[:cut]
        line = line[cut:]
    yield line


def _pieces(text: str, min_chars: int):
    """Blank-line-separated paragraphs; a paragraph longer than ``min_chars`` (e.g. a file with one
    sentence per line and no blank lines) is cut further at line ends, and a huge line (a whole
    file without line breaks) at spaces, so that it still gives many documents."""
    for para in text.replace("\r\n", "\n").replace("\r", "\n").split("\n\n"):
        if len(para) <= min_chars:
            yield para
            continue
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


def chunk_paragraphs(text: str, min_chars: int = 2000) -> list[str]:
    """Group consecutive paragraphs into documents of >= ``min_chars``, so that one long file still
    gives a validation split drawn from all of it."""
    docs, buf, size = [], [], 0
    for para in _pieces(text, min_chars):
        para = para.strip()
        if not para:
            continue
        buf.append(para)
        size += len(para)
        if size >= min_chars:
            docs.append("\n\n".join(buf))
            buf, size = [], 0
    if buf:
        docs.append("\n\n".join(buf))
    return docs


def read_text_file(path: Path) -> list[str]:
    return chunk_paragraphs(_decode(path, _read_bytes(path)))


def read_jsonl(path: Path, text_field: str) -> list[str]:
    """One document per JSON object line, its text in ``text_field``."""
    docs = []
    for n, line in enumerate(_decode(path, _read_bytes(path)).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise PlelabError(f"{path} line {n} is not valid JSON ({err.msg}); "
                              "each line must be one JSON object") from None
        if not isinstance(record, dict) or text_field not in record:
            raise PlelabError(f"{path} line {n} has no field {text_field!r}; choose the text field with --text-field")
        if not isinstance(record[text_field], str):
            raise PlelabError(f"{path} line {n}: field {text_field!r} is {type(record[text_field]).__name__}, not text")
        if record[text_field].strip():
            docs.append(record[text_field].strip())
    return docs


def read_parquet(path: Path, text_field: str) -> list[str]:
    try:
        import pyarrow.parquet as pq  # optional: the data extra, for users' Parquet files
    except ImportError:
        raise PlelabError(f"reading {path} needs pyarrow: pip install pyarrow") from None
    try:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        if text_field not in names:
            raise PlelabError(f"{path} has no column {text_field!r} (columns: {', '.join(names)}); "
                              "choose the text column with --text-field")
        table = pf.read(columns=[text_field])
    except PlelabError:
        raise
    except Exception as err:  # pyarrow raises ArrowInvalid / OSError for damaged files
        raise PlelabError(f"cannot read Parquet file {path}: {str(err).splitlines()[0]}") from None
    return [t.strip() for t in table.column(text_field).to_pylist() if isinstance(t, str) and t.strip()]


def read_hf_dataset(path: Path, text_field: str) -> list[str]:
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
    return [t.strip() for t in ds[text_field] if isinstance(t, str) and t.strip()]


def _is_hf_dataset_dir(path: Path) -> bool:
    return (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()


def read_file(path: Path, text_field: str) -> list[str]:
    if path.suffix == ".jsonl":
        return read_jsonl(path, text_field)
    if path.suffix == ".parquet":
        return read_parquet(path, text_field)
    return read_text_file(path)


def user_corpus(path: str | os.PathLike, text_field: str = "text") -> Corpus:
    """Read a file, a folder of ``.txt/.md/.jsonl/.parquet`` files (sorted), or a HF datasets folder."""
    p = Path(path)
    if not p.exists():
        raise PlelabError(f"data path {p} does not exist; pass a text/JSONL/Parquet file or a folder")
    if p.is_dir():
        if _is_hf_dataset_dir(p):
            docs = read_hf_dataset(p, text_field)
        else:
            files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in READABLE_SUFFIXES)
            if not files:
                raise PlelabError(f"data folder {p} has no {'/'.join(READABLE_SUFFIXES)} files")
            docs = [d for f in files for d in read_file(f, text_field)]
    else:
        docs = read_file(p, text_field)
    if not docs:
        raise PlelabError(f"data path {p} holds no text (empty files or empty text fields); pass non-empty UTF-8 text")
    return Corpus(name=p.name, documents=docs)


def load_corpus(path: str | None, text_field: str = "text") -> Corpus:
    """``None`` -> the embedded corpus; otherwise the user's data at ``path``."""
    return embedded_corpus() if path is None else user_corpus(path, text_field)
