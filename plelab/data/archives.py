"""Users' files as byte blocks — plain, ``.gz`` or ``.zst`` — read to a verified end.

A decompressor that meets the end of its input inside a frame may simply stop: zstandard's stream reader reports
end-of-file at a cut frame, so a ``.zst`` copied halfway would ingest as a smaller corpus with a fingerprint of its
own, and nothing would say so. Hence:

- ``.zst``: before any byte is decompressed, :func:`check_zstd_frames` walks the file's frames (headers and block
  headers only, seeking over block contents: a few reads per compressed MiB) and refuses, in one line naming the
  file, a frame cut short or bytes that are not a frame; the decompressor then reads across every frame and checks
  each block's content (and the frame checksum, when the file has one);
- ``.gz``: Python's ``gzip`` already raises at a missing end-of-stream marker and checks each member's CRC-32;
- every read error becomes one :class:`~plelab.errors.PlelabError` line naming the file and the fix.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from pathlib import Path

from plelab.errors import PlelabError

BLOCK_BYTES = 1 << 20  # files are read this many (decompressed) bytes at a time
ZSTD_MAGIC = 0xFD2FB528
ZSTD_SKIPPABLE = range(0x184D2A50, 0x184D2A60)  # skippable frames: magic, 4-byte length, user data
ZSTD_MAX_HEADER = 18  # magic (4) + the longest frame header (14), RFC 8878 §3.1.1


def _zstd():
    try:
        import zstandard  # optional: the data extra, for .zst archives
    except ImportError:
        raise PlelabError("reading .zst archives needs zstandard: pip install zstandard") from None
    return zstandard


def check_zstd_frames(path: Path) -> int:
    """Walk the frames of the ``.zst`` file ``path`` to its last byte (RFC 8878: frame header, then blocks of a
    3-byte header each — last-block bit, type, size — then a 4-byte checksum when the header says so); returns the
    number of frames. One line for a file that ends inside a frame or holds bytes that are no frame."""
    zstandard, size, pos, frames = _zstd(), path.stat().st_size, 0, 0

    def cut(start: int) -> PlelabError:
        return PlelabError(f"cannot read {path}: the zstd archive is truncated (frame {frames + 1}, from byte "
                           f"{start:,}, is cut: the file ends at byte {size:,}); re-create or re-copy it")

    with open(path, "rb") as f:
        while pos < size:
            start = pos
            f.seek(pos)
            head = f.read(ZSTD_MAX_HEADER)
            magic = int.from_bytes(head[:4], "little") if len(head) >= 4 else None
            if magic in ZSTD_SKIPPABLE:
                pos += 8 + (int.from_bytes(head[4:8], "little") if len(head) >= 8 else size)
            elif magic == ZSTD_MAGIC:
                try:
                    pos += zstandard.frame_header_size(head)
                except zstandard.ZstdError:
                    raise cut(start) from None
                while True:
                    f.seek(pos)
                    block = f.read(3)
                    if len(block) < 3:
                        raise cut(start)
                    value = int.from_bytes(block, "little")
                    kind, length = (value >> 1) & 3, value >> 3
                    if kind == 3:
                        raise PlelabError(f"cannot read {path}: the zstd archive is damaged (a reserved block type "
                                          f"at byte {pos:,}); re-create it")
                    pos += 3 + (1 if kind == 1 else length)  # an RLE block stores one byte
                    if value & 1:
                        break
                pos += 4 if head[4] & 0x04 else 0  # the content checksum
            elif frames and len(head) < 4:
                raise cut(start)
            else:
                raise PlelabError(f"cannot read {path}: byte {start:,} does not start a zstd frame (it is damaged, "
                                  "or not zstd); re-create it, or drop the .zst suffix if it is not compressed")
            if pos > size:
                raise cut(start)
            frames += 1
    return frames


def open_binary(path: Path):
    """``path`` opened for reading bytes, through its decompressor (``.gz``, ``.zst``: checked first)."""
    try:
        if path.name.lower().endswith(".gz"):
            return gzip.open(path, "rb")
        if path.name.lower().endswith(".zst"):
            check_zstd_frames(path)
            return _zstd().ZstdDecompressor().stream_reader(open(path, "rb"), read_across_frames=True, closefd=True)
        return open(path, "rb")
    except IsADirectoryError:
        raise PlelabError(f"{path} is a folder where a file was expected") from None
    except OSError as err:
        raise PlelabError(f"cannot read {path}: {err.strerror or err}; check the path and its permissions") from None


def blocks(path: Path) -> Iterator[bytes]:
    """The (decompressed) bytes of ``path`` in blocks, to the verified end; a damaged archive is a one-line error
    naming the file."""
    with open_binary(path) as f:
        while True:
            try:
                block = f.read(BLOCK_BYTES)
            except (OSError, EOFError, zlib.error) as err:
                raise PlelabError(f"cannot read {path}: the archive is damaged or truncated "
                                  f"({str(err).splitlines()[0] or type(err).__name__}); re-create it") from None
            except Exception as err:  # zstandard.ZstdError
                raise PlelabError(f"cannot read {path}: the archive is damaged ({str(err).splitlines()[0]}); "
                                  "re-create it") from None
            if not block:
                return
            yield block
