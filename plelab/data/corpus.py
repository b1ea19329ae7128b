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
import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from plelab.errors import PlelabError
from plelab.io import cache_dir, write_json

_EXTRACTOR_VERSION = 1  # bump when the extraction rules change
_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "lib2to3",
              "turtledemo", "ensurepip"}


def corpus_fingerprint(documents) -> str:
    """sha256 over every document's UTF-8 length (8 bytes, little-endian) and bytes, in order; any iterable of
    documents, streamed (what identifies a corpus, its tokenizer sample, and what ``--verify`` re-checks)."""
    h = hashlib.sha256()
    for doc in documents:
        data = doc.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


@dataclass
class Corpus:
    """Named documents plus a sha256 fingerprint over their exact text and order."""

    name: str
    documents: list[str]

    @property
    def fingerprint(self) -> str:
        return corpus_fingerprint(self.documents)

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


def embedded_key() -> str:
    """What identifies the embedded corpus without extracting it: the interpreter, its stdlib path, the rules."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return hashlib.sha256(f"{sys.version}|{root}|{_EXTRACTOR_VERSION}".encode()).hexdigest()[:16]


def embedded_name() -> str:
    return f"python{sys.version_info.major}.{sys.version_info.minor}-docs"


def embedded_corpus() -> Corpus:
    """The interpreter's documentation topics and standard-library docstrings (deterministic).

    Extracted once per interpreter and cached as JSON in the plelab cache folder.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    name, key = embedded_name(), embedded_key()
    cached = cache_dir("corpus") / f"{name}-{key}.json"
    if cached.exists():
        try:
            return Corpus(name=name, documents=json.loads(cached.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            pass  # a damaged cache entry is rebuilt below
    corpus = Corpus(name=name, documents=_extract_embedded(root))
    write_json(cached, corpus.documents)
    return corpus


def _extract_embedded(root: Path) -> list[str]:
    docs: list[str] = []
    try:
        from pydoc_data.topics import topics  # optional stdlib part, read once to build the corpus
    except ImportError:  # some minimal Python builds drop pydoc_data
        topics = {}
    docs += [topics[k].strip() for k in sorted(topics) if topics[k].strip()]
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
    return docs
