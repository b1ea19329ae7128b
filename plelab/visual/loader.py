"""Users' image–caption pairs: a JSONL file of ``{"image": path, "caption": text}`` lines (paths
relative to the file), or a folder of images each with a same-named ``.txt`` caption beside it.

Images are read with Pillow, converted to RGB and resized (bicubic) to ``image_size``²; there are
no patch labels for users' data (NMI and the oracle control need the embedded scenes). Every
problem — a missing or unreadable image, a file that is not an image, a line that is not JSON or
lacks a field, an empty caption, nothing found at all — stops with one line naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from plelab.errors import PlelabError
from plelab.visual.scenes import SceneSet

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")


def _read_image(path: Path, image_size: int, where: str) -> np.ndarray:
    # heavy (~0.1 s): only users' image files need Pillow, not the embedded scenes
    from PIL import Image, UnidentifiedImageError

    if path.is_dir():
        raise PlelabError(f"{where}: image {path} is a folder, not an image file; fix the path")
    if not path.is_file():
        raise PlelabError(f"{where}: image {path} does not exist; fix the path (relative paths are read from the "
                          "JSONL file's folder)")
    try:
        with Image.open(path) as im:
            im = im.convert("RGB").resize((image_size, image_size), Image.Resampling.BICUBIC)
            return np.asarray(im, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as err:
        raise PlelabError(f"{where}: {path} is not a readable image ({str(err).splitlines()[0]}); "
                          "replace or remove it") from None


def _pairs_from_jsonl(path: Path) -> list[tuple[Path, str, str]]:
    pairs = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="strict").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except ValueError:
            raise PlelabError(f"{where} is not valid JSON; each line must be {{\"image\": ..., \"caption\": ...}}"
                              ) from None
        if not (isinstance(row, dict) and isinstance(row.get("image"), str) and isinstance(row.get("caption"), str)):
            raise PlelabError(f"{where} needs string fields \"image\" and \"caption\"")
        pairs.append((path.parent / row["image"], row["caption"], where))
    return pairs


def _pairs_from_folder(path: Path) -> list[tuple[Path, str, str]]:
    pairs = []
    for img in sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES):
        txt = img.with_suffix(".txt")
        if not txt.is_file():
            raise PlelabError(f"{img} has no caption file {txt.name} beside it; add one or remove the image")
        try:
            pairs.append((img, txt.read_text(encoding="utf-8").strip(), str(txt)))
        except UnicodeDecodeError:
            raise PlelabError(f"{txt} is not UTF-8 text; captions must be UTF-8") from None
    return pairs


def split_pairs(pairs: SceneSet) -> tuple[SceneSet, SceneSet]:
    """Users' pairs into (train, held-out): the first tenth (at least 2) is held out."""
    cut = max(2, len(pairs) // 10)
    if len(pairs) - cut < 2:
        raise PlelabError(f"{len(pairs)} image–caption pairs are too few to split into train and held-out; add more")
    return (SceneSet(pairs.images[cut:], pairs.captions[cut:], pairs.patch),
            SceneSet(pairs.images[:cut], pairs.captions[:cut], pairs.patch))


def load_image_captions(path: str | Path, image_size: int = 48, patch: int = 8) -> SceneSet:
    """Read users' pairs into a :class:`SceneSet` without patch labels."""
    path = Path(path)
    if not path.exists():
        raise PlelabError(f"image–caption data {path} does not exist; give a .jsonl file or a folder of images "
                          "with .txt captions")
    if image_size % patch:
        raise PlelabError(f"image size {image_size} is not a multiple of the patch size {patch}")
    try:
        pairs = _pairs_from_jsonl(path) if path.is_file() else _pairs_from_folder(path)
    except UnicodeDecodeError:
        raise PlelabError(f"{path} is not UTF-8 text; captions must be UTF-8") from None
    except OSError as err:
        raise PlelabError(f"cannot read {path}: {err.strerror or err}") from None
    if not pairs:
        raise PlelabError(f"no image–caption pairs found in {path}; a JSONL needs lines "
                          "{\"image\": path, \"caption\": text}, a folder needs images with .txt captions")
    images, captions = [], []
    for img, cap, where in pairs:
        if not cap.strip():
            raise PlelabError(f"{where}: the caption of {img.name} is empty")
        images.append(_read_image(img, image_size, where))
        captions.append(cap.strip())
    return SceneSet(np.stack(images), captions, patch)
