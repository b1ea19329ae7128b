"""Text corpora as lists of documents: the embedded default and users' plain-text files.

The **embedded default corpus** is real English that every CPython installation ships:
the docstrings of the standard library (read with ``ast`` from the source files, never
imported, so nothing executes) and the interpreter's documentation topics
(``pydoc_data.topics``). One module or one topic is one document. Extraction is
deterministic (sorted walk), so the corpus fingerprint identifies it exactly; it is about
2.1 M characters on CPython 3.11.
"""

from __future__ import annotations

import ast
import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from plelab.errors import PlelabError

_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "lib2to3",
              "turtledemo", "ensurepip"}


@dataclass
class Corpus:
    """Named documents plus a sha256 fingerprint over their exact text and order."""

    name: str
    documents: list[str]

    @property
    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for doc in self.documents:
            data = doc.encode("utf-8")
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
        return h.hexdigest()

    @property
    def num_chars(self) -> int:
        return sum(len(d) for d in self.documents)


def _module_docstrings(path: Path) -> str:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
        return ""
    docs = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and doc.strip():
                docs.append(doc.strip())
    return "\n\n".join(docs)


def embedded_corpus() -> Corpus:
    """The interpreter's documentation topics and standard-library docstrings (deterministic)."""
    docs: list[str] = []
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some minimal Python builds drop pydoc_data
        topics = {}
    docs += [topics[k].strip() for k in sorted(topics) if topics[k].strip()]
    root = Path(sysconfig.get_paths()["stdlib"])
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith((".", "config-")))
        for fn in sorted(filenames):
            if fn.endswith(".py"):
                text = _module_docstrings(Path(dirpath) / fn)
                if text:
                    docs.append(text)
    if not docs:
        raise PlelabError(f"the embedded corpus is empty: no docstrings found under {root}; "
                          "pass your own text with --data PATH")
    return Corpus(name=f"python{sys.version_info.major}.{sys.version_info.minor}-docs", documents=docs)


def _read_text_file(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise PlelabError(f"cannot read {path}: {err.strerror or err}; check the path and its permissions") from None
    if b"\x00" in data[:8192]:
        raise PlelabError(f"{path} looks binary (it contains NUL bytes); pass UTF-8 text files")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise PlelabError(f"{path} is not UTF-8 (invalid byte at offset {err.start}); convert it to UTF-8") from None


def _chunk_paragraphs(text: str, min_chars: int) -> list[str]:
    """Group consecutive blank-line-separated paragraphs into documents of >= ``min_chars``."""
    docs, buf, size = [], [], 0
    for para in text.split("\n\n"):
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


def text_corpus(path: str | os.PathLike, doc_chars: int = 2000) -> Corpus:
    """A UTF-8 text file, or a folder of ``.txt``/``.md`` files read in sorted order.

    Each file is cut into documents of about ``doc_chars`` characters at paragraph
    boundaries, so that a validation split can be drawn across the whole text.
    """
    p = Path(path)
    if not p.exists():
        raise PlelabError(f"data path {p} does not exist; pass a text file or a folder of .txt files")
    files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in (".txt", ".md")) if p.is_dir() else [p]
    if not files:
        raise PlelabError(f"data folder {p} has no .txt or .md files")
    docs: list[str] = []
    for f in files:
        docs += _chunk_paragraphs(_read_text_file(f), doc_chars)
    if not docs:
        raise PlelabError(f"data path {p} holds no text (all files are empty); pass non-empty UTF-8 text")
    return Corpus(name=p.name, documents=docs)


def load_corpus(path: str | None) -> Corpus:
    """``None`` -> the embedded corpus; otherwise the user's text file or folder."""
    return embedded_corpus() if path is None else text_corpus(path)
