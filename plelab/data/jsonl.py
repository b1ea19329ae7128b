"""JSONL text, streamed line by line through the decompressor (:mod:`plelab.data.archives`: read to a verified end).

One document per line: a JSON object whose ``text_field`` holds the text (null and blank texts are skipped). Every
way a line can fail to parse is one :class:`~plelab.errors.PlelabError` naming the file and the line — invalid JSON,
a line nested deeper than the parser's recursion limit, an integer of more digits than Python converts (4,300), a
line longer than :data:`MAX_LINE` — never a traceback.

A lone surrogate escape (``"\\ud800"`` with no partner, common in web dumps: a UTF-16 string cut between its two
halves) is not a character and has no UTF-8 form, so nothing downstream (hashing, the tokenizer) could take it: it
is read as U+FFFD, the replacement character, as a UTF-8 decoder reads an invalid byte. A surrogate pair
(``"\\ud83d\\ude00"``) is one character and is read as it is.
"""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from plelab.data.archives import BLOCK_BYTES, blocks
from plelab.errors import PlelabError

MAX_LINE = 1 << 26  # a JSONL line (one document) longer than 64 MiB is refused, not read whole
_SURROGATE = re.compile("[\ud800-\udfff]")


def _parse(path: Path, n: int, line: str) -> object:
    """The JSON value of line ``n``, or one line saying why it has none."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        why = f"is not valid JSON ({err.msg}); each line must be one JSON object"
    except RecursionError:
        why = (f"is nested deeper than the JSON parser follows (about {sys.getrecursionlimit():,} levels); each line "
               "must be one JSON object holding its text field")
    except ValueError:  # an integer of more digits than int() converts (sys.get_int_max_str_digits())
        why = (f"holds an integer of more than {sys.get_int_max_str_digits():,} digits, more than Python reads; "
               "store it as a string or drop that field")
    raise PlelabError(f"{path} line {n} {why}")


def jsonl_documents(path: Path, text_field: str) -> Iterator[str]:
    """One document per JSON object line, its text in ``text_field`` (null and blank texts are skipped)."""
    lines = io.BufferedReader(_LineSource(path), BLOCK_BYTES)
    n = 0
    while True:
        raw = lines.readline(MAX_LINE + 1)
        if not raw:
            return
        n += 1
        if len(raw) > MAX_LINE:
            raise PlelabError(f"{path} line {n} is longer than {MAX_LINE >> 20} MiB; JSONL holds one document per "
                              "line (a JSON array is not JSONL)")
        try:
            line = raw.decode("utf-8-sig" if n == 1 else "utf-8")  # a byte-order mark (Windows editors) is not text
        except UnicodeDecodeError as err:
            raise PlelabError(f"{path} line {n} is not UTF-8 (invalid byte at column {err.start + 1}); "
                              "convert the file to UTF-8") from None
        if not line.strip():
            continue
        record = _parse(path, n, line)
        if not isinstance(record, dict) or text_field not in record:
            found = (f" (its fields: {', '.join(repr(k) for k in list(record)[:8])}"
                     f"{', …' if len(record) > 8 else ''})" if isinstance(record, dict) and record else "")
            raise PlelabError(f"{path} line {n} has no field {text_field!r}{found}; choose the text field with "
                              "--text-field")
        text = record[text_field]
        if text is None:
            continue
        if not isinstance(text, str):
            raise PlelabError(f"{path} line {n}: field {text_field!r} is {type(text).__name__}, not text")
        if _SURROGATE.search(text):
            text = _SURROGATE.sub("\ufffd", text)
        if text.strip():
            yield text.strip()


class _LineSource(io.RawIOBase):
    """:func:`~plelab.data.archives.blocks` as a readable raw stream (so ``TextIOWrapper`` can read lines through any decompressor)."""

    def __init__(self, path: Path) -> None:
        self._it = blocks(path)
        self._buf = next(self._it, b"")
        if b"\x00" in self._buf[:65536]:
            raise PlelabError(f"{path} looks binary (it contains NUL bytes); pass UTF-8 JSON lines "
                              "(a compressed file needs its .gz or .zst suffix)")

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf:
            self._buf = next(self._it, b"")
            if not self._buf:
                return 0
        n = min(len(b), len(self._buf))
        b[:n], self._buf = self._buf[:n], self._buf[n:]
        return n
