"""The embedded image–caption data: procedurally generated scenes with per-patch ground truth.

Each scene has one to three objects — a shape (square, circle, triangle) in a colour (six), a size
(small, large) and a position on a 3×3 grid (top/middle/bottom × left/center/right) — drawn on a
dark, slightly noisy background. The caption follows from the scene, objects in reading order:

    "two objects : a small red circle at the top left and a large blue square at the bottom right ."

Content words (count, size, colour, shape, position) carry the scene; the rest is template. For
every patch the generator keeps what covers most of it (the object's colour, shape, size and
index, or background), so that visual IDs can be scored against the truth (NMI) and an oracle
tokenizer can key the table by exactly the caption-relevant facts.

Deterministic: scene ``i`` of seed ``s`` is drawn from its own generator seeded by ``(s, i)``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from plelab.errors import PlelabError

SHAPES = ("square", "circle", "triangle")
COLOURS = {"red": (220, 40, 40), "green": (40, 190, 60), "blue": (50, 80, 230), "yellow": (230, 210, 40),
           "purple": (150, 60, 200), "white": (235, 235, 235)}
SIZES = ("small", "large")
ROWS, COLS = ("top", "middle", "bottom"), ("left", "center", "right")
COUNT_WORDS = ("one", "two", "three")
CONTENT_WORDS = frozenset((*SHAPES, *COLOURS, *SIZES, *ROWS, *COLS, *COUNT_WORDS, "object", "objects"))


@dataclass
class SceneSet:
    """``images [N,S,S,3] uint8``; ``captions`` N strings; per-patch labels ``[N, P]`` int64 in raster
    order (P = (S/patch)²): ``patch_colour``/``patch_shape``/``patch_size`` (0 = background, else
    1 + index into COLOURS / SHAPES / SIZES) and ``patch_object`` (0 = background, else 1 + object)."""

    images: np.ndarray
    captions: list[str]
    patch: int
    patch_colour: np.ndarray | None = None
    patch_shape: np.ndarray | None = None
    patch_size: np.ndarray | None = None
    patch_object: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.captions)

    @property
    def image_size(self) -> int:
        return self.images.shape[1]

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch) ** 2

    @property
    def has_labels(self) -> bool:
        return self.patch_colour is not None

    def semantic_labels(self) -> np.ndarray:
        """One label per patch for the caption-relevant facts: 0 background, else colour × shape × size."""
        fg = self.patch_colour > 0
        combo = ((self.patch_colour - 1) * len(SHAPES) + (self.patch_shape - 1)) * len(SIZES) + (self.patch_size - 1)
        return np.where(fg, 1 + combo, 0)


def _mask(kind: str, cy: float, cx: float, r: float, size: int) -> np.ndarray:
    y, x = np.mgrid[0:size, 0:size].astype(np.float64) + 0.5
    dy, dx = y - cy, x - cx
    if kind == "square":
        return (np.abs(dx) <= r) & (np.abs(dy) <= r)
    if kind == "circle":
        return dx ** 2 + dy ** 2 <= r ** 2
    return (dy >= -r) & (dy <= r) & (np.abs(dx) <= (dy + r) / 2)  # triangle, apex up


def _scene(rng: np.random.Generator, size: int, patch: int):
    n = int(rng.integers(1, 4))
    cells = rng.choice(9, size=n, replace=False)
    cells.sort()  # reading order: row-major over the 3×3 grid
    img = rng.normal(24, 6, size=(size, size, 3))
    owner = np.full((size, size), -1)
    objects = []
    cell = size / 3
    for k, c in enumerate(cells):
        shape, colour, sz = (SHAPES[rng.integers(3)], list(COLOURS)[rng.integers(len(COLOURS))],
                             SIZES[rng.integers(2)])
        r = cell * (0.25 if sz == "small" else 0.42)
        cy = (c // 3 + 0.5) * cell + rng.uniform(-0.08, 0.08) * cell
        cx = (c % 3 + 0.5) * cell + rng.uniform(-0.08, 0.08) * cell
        m = _mask(shape, cy, cx, r, size)
        rgb = np.array(COLOURS[colour], dtype=np.float64) + rng.normal(0, 10, 3)
        img[m] = rgb + rng.normal(0, 4, size=(int(m.sum()), 3))
        owner[m] = k
        objects.append({"shape": shape, "colour": colour, "size": sz, "row": ROWS[c // 3], "col": COLS[c % 3]})
    g = size // patch
    # per patch: the object covering most pixels (background if none covers an eighth of it)
    blocks = owner.reshape(g, patch, g, patch).transpose(0, 2, 1, 3).reshape(g * g, patch * patch)
    labels = np.zeros((4, g * g), dtype=np.int64)
    for p, blk in enumerate(blocks):
        counts = np.bincount(blk[blk >= 0], minlength=n) if (blk >= 0).any() else np.zeros(n, dtype=np.int64)
        if counts.size and counts.max() * 8 >= blk.size:
            o = int(counts.argmax())
            ob = objects[o]
            labels[:, p] = (1 + list(COLOURS).index(ob["colour"]), 1 + SHAPES.index(ob["shape"]),
                            1 + SIZES.index(ob["size"]), 1 + o)
    return np.clip(img, 0, 255).astype(np.uint8), caption(objects), labels


def fingerprint(scenes: SceneSet) -> str:
    """sha256 of the images and captions (identifies a data set in caches and run records)."""
    h = hashlib.sha256(np.ascontiguousarray(scenes.images).tobytes())
    h.update("\n".join(scenes.captions).encode())
    return h.hexdigest()


def caption(objects: list[dict]) -> str:
    """The caption of a scene (objects in reading order)."""
    parts = [f"a {o['size']} {o['colour']} {o['shape']} at the {o['row']} {o['col']}" for o in objects]
    n = len(objects)
    return f"{COUNT_WORDS[n - 1]} {'object' if n == 1 else 'objects'} : " + " and ".join(parts) + " ."


def generate_scenes(n: int, seed: int = 0, image_size: int = 48, patch: int = 8) -> SceneSet:
    """``n`` scenes, deterministic in ``(seed, index)``; ``image_size`` must be a multiple of ``patch``."""
    if patch < 1 or image_size % patch or image_size < 2 * patch:
        raise PlelabError(f"image size {image_size} must be a multiple of the patch size {patch}, at least twice it")
    imgs, caps, labels = [], [], []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        img, cap, lab = _scene(rng, image_size, patch)
        imgs.append(img)
        caps.append(cap)
        labels.append(lab)
    lab = np.stack(labels, axis=1) if labels else np.zeros((4, 0, (image_size // patch) ** 2), dtype=np.int64)
    return SceneSet(np.stack(imgs) if imgs else np.zeros((0, image_size, image_size, 3), np.uint8), caps, patch,
                    patch_colour=lab[0], patch_shape=lab[1], patch_size=lab[2], patch_object=lab[3])
