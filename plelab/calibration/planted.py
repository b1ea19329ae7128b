"""A planted corpus: token ids whose identity gives away the next token, with the rule known exactly.

Background tokens are drawn i.i.d. from a Zipf law over a random ordering of the ``vocab`` ids (like natural
text's frequencies). Half of the ids are *keys*; each key ``k`` has a value ``v(k)`` (a fixed random id). After
a key at position t, position t + ``gap`` is ``v(k)`` with probability ``p`` — so a table row of a key has
something to learn that no other row has (where the key points), and every layer's lookup puts it in the key
position's residual stream. The benchmark's LEARNED truth for real ids on this corpus is known by construction.
Whether the table *benefits* is not: the main embedding can learn the same bigram (at cpu-tiny scale a table
and a zeroed one end within 0.01 nats), so BENEFIT's truth is still read from the runs. ``gap`` = 2 (a skip-bigram,
which needs attention) is not learned within the benchmark's 320 steps at these scales.

Written as one ``.npy`` shard (``plelab train --data planted.npy``); the same seed gives the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from plelab.io import atomic_write

TOKENS = 1 << 21
ZIPF = 1.0


def planted_tokens(tokens: int = TOKENS, vocab: int = 512, gap: int = 1, p: float = 0.8,
                   seed: int = 0) -> np.ndarray:
    """``[tokens]`` uint16 ids below ``vocab`` with the planted key → value rule (see the module doc)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(vocab)
    weights = 1.0 / np.arange(1, vocab + 1) ** ZIPF
    ids = order[rng.choice(vocab, size=tokens, p=weights / weights.sum())]
    is_key = np.zeros(vocab, dtype=bool)
    is_key[rng.permutation(vocab)[: vocab // 2]] = True
    value = rng.integers(0, vocab, size=vocab)
    planted = rng.random(tokens) < p
    for t in range(tokens - gap):  # sequential: a planted value may itself be a key
        if is_key[ids[t]] and planted[t]:
            ids[t + gap] = value[ids[t]]
    return ids.astype(np.uint16)


def write_planted(path: str | Path, vocab: int = 512, seed: int = 0) -> Path:
    """Write the planted corpus to ``path`` (``.npy``) unless it is there already (same seed, same bytes)."""
    path = Path(path)
    if not path.exists():
        ids = planted_tokens(vocab=vocab, seed=seed)
        atomic_write(path, lambda tmp: _save(tmp, ids))
    return path


def _save(path: Path, ids: np.ndarray) -> None:
    with open(path, "wb") as f:  # a file object: np.save would add ".npy" to the temporary file's name
        np.save(f, ids, allow_pickle=False)
