"""Text corpora as lists of documents: the embedded default and users' plain-text files.

The **embedded default corpus** is real English that every CPython installation ships:
the docstrings of the standard library (read with ``ast`` from the source files, never
imported, so nothing executes) and the interpreter's documentation topics
(``pydoc_data.topics``). One module or one topic is one document. Extraction is
deterministic (sorted walk), so the corpus fingerprint identifies it exactly; it is about
2.1 M characters on CPython 3.11.

``data.embedded=packages`` adds, after those, the docstrings of the packages every plelab install
has (:data:`PACKAGE_CORPUS`: plelab's dependencies and torch's own), read the same way — about
23 M characters in all with torch 2.13, numpy 2.4, scipy 1.17, matplotlib 3.11, sympy 1.14, mpmath 1.3
and networkx 3.6: a corpus for studies that train past a few epochs of the standard library's text.
Its name carries no versions; its cache key and fingerprint do.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from plelab.config.schema import EmbeddedCorpus
from plelab.errors import PlelabError
from plelab.io import cache_dir, write_json

_EXTRACTOR_VERSION = 1  # bump when the extraction rules change
EMBEDDED = get_args(EmbeddedCorpus)  # the values of data.embedded
# Installed with every plelab: its own dependencies (torch, numpy, scipy, matplotlib) and torch's (sympy, its
# mpmath, networkx). Distribution and import names agree for all of them.
PACKAGE_CORPUS = ("torch", "numpy", "scipy", "matplotlib", "sympy", "mpmath", "networkx")
# Installed with every plelab too (pillow and tqdm directly; jinja2, fsspec and filelock with torch) and in neither
# embedded training corpus: the out-of-distribution validation text of ``data.ood=other-libraries`` (imaging,
# templating, file systems, progress bars, file locks — none of the training corpus's libraries).
OTHER_LIBRARIES = ("PIL", "jinja2", "fsspec", "tqdm", "filelock")
DISTRIBUTIONS = {"PIL": "pillow"}  # import name -> distribution name, where they differ
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


def _package_root(name: str, names: tuple[str, ...] | None = None) -> Path:
    """Where an installed package's source lies, found without importing it (a top-level ``find_spec`` runs no
    package code). ``names``: the corpus it belongs to (None: :data:`PACKAGE_CORPUS`), for the message."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        what = "data.embedded=packages" if names is None else "data.ood=other-libraries"
        names = PACKAGE_CORPUS if names is None else names
        raise PlelabError(f"{what} reads the docstrings of {', '.join(names)}, but {name} is not installed: pip "
                          f"install {DISTRIBUTIONS.get(name, name)}, or drop {what.split('=')[0]}")
    return Path(sorted(spec.submodule_search_locations)[0])


def _package_versions(names: tuple[str, ...] | None = None) -> list[list[str]]:
    """``[[name, version, source folder], …]`` of ``names`` (None: :data:`PACKAGE_CORPUS`): what identifies a corpus
    of their docstrings."""
    rows = []
    for name in PACKAGE_CORPUS if names is None else names:
        root = _package_root(name, names)
        try:
            version = importlib.metadata.version(DISTRIBUTIONS.get(name, name))
        except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path, without metadata
            version = "unknown"
        rows.append([name, version, str(root)])
    return rows


def _check(which: str) -> None:
    if which not in EMBEDDED:
        raise PlelabError(f"unknown embedded corpus {which!r}: choose {' or '.join(EMBEDDED)}")


def embedded_key(which: str = "stdlib") -> str:
    """What identifies an embedded corpus without extracting it: the interpreter, its stdlib path, the rules (and
    for ``packages`` each package's version and folder)."""
    _check(which)
    root = Path(sysconfig.get_paths()["stdlib"])
    text = f"{sys.version}|{root}|{_EXTRACTOR_VERSION}"
    if which == "packages":
        text += "|" + json.dumps(_package_versions())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def embedded_name(which: str = "stdlib") -> str:
    _check(which)
    tag = "-packages" if which == "packages" else ""
    return f"python{sys.version_info.major}.{sys.version_info.minor}{tag}-docs"


def _cached(name: str, key: str, extract) -> list[str]:
    cached = cache_dir("corpus") / f"{name}-{key}.json"
    if cached.exists():
        try:
            return json.loads(cached.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            pass  # a damaged cache entry is rebuilt below
    documents = extract()
    write_json(cached, documents)
    return documents


def embedded_corpus(which: str = "stdlib") -> Corpus:
    """The interpreter's documentation topics and standard-library docstrings (``stdlib``), or those followed by
    the docstrings of :data:`PACKAGE_CORPUS` (``packages``); deterministic.

    Extracted once per interpreter (and package versions) and cached as JSON in the plelab cache folder.
    """
    _check(which)
    root = Path(sysconfig.get_paths()["stdlib"])
    documents = _cached(embedded_name(), embedded_key(), lambda: _extract_embedded(root))
    if which == "packages":
        documents = documents + _cached(embedded_name(which), embedded_key(which), _extract_packages)
    return Corpus(name=embedded_name(which), documents=documents)


def other_libraries_corpus() -> Corpus:
    """The docstrings of :data:`OTHER_LIBRARIES`, one module one document (deterministic, cached like the embedded
    corpora): text from none of the embedded training corpora's libraries, for ``data.ood=other-libraries``."""
    key = hashlib.sha256(f"{sys.version}|{_EXTRACTOR_VERSION}|{json.dumps(_package_versions(OTHER_LIBRARIES))}"
                         .encode()).hexdigest()[:16]
    name = f"python{sys.version_info.major}.{sys.version_info.minor}-other-libraries-docs"
    documents = _cached(name, key, lambda: [doc for lib in OTHER_LIBRARIES
                                            for doc in _docstring_documents(_package_root(lib, OTHER_LIBRARIES))])
    return Corpus(name=name, documents=documents)


def _docstring_documents(root: Path) -> list[str]:
    """One document per ``.py`` file under ``root`` (sorted walk, test and private-tool folders skipped): its
    docstrings joined by blank lines."""
    docs = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith((".", "config-")))
        for fn in sorted(filenames):
            if fn.endswith(".py"):
                text = _module_docstrings(Path(dirpath) / fn)
                if text:
                    docs.append(text)
    return docs


def _extract_packages() -> list[str]:
    return [doc for name in PACKAGE_CORPUS for doc in _docstring_documents(_package_root(name))]


def _extract_embedded(root: Path) -> list[str]:
    docs: list[str] = []
    try:
        from pydoc_data.topics import topics  # optional stdlib part, read once to build the corpus
    except ImportError:  # some minimal Python builds drop pydoc_data
        topics = {}
    docs += [topics[k].strip() for k in sorted(topics) if topics[k].strip()]
    docs += _docstring_documents(root)
    if not docs:
        raise PlelabError(f"the embedded corpus is empty: no docstrings found under {root}; "
                          "pass your own text with --data PATH")
    return docs
