"""A planted corpus: token ids whose identity gives away the next token, with the rule known exactly.

Background tokens are drawn i.i.d. from a Zipf law over a random ordering of the ``vocab`` ids (like natural
text's frequencies). Half of the ids are *keys*; each key ``k`` has a value ``v(k)`` (a fixed random id). After
a key at position t, position t + ``gap`` is ``v(k)`` with probability ``p`` — so a table row of a key has
something to learn that no other row has (where the key points), and every layer's lookup puts it in the key
position's residual stream. The benchmark's LEARNED truth for real ids on this corpus is known by construction.

BENEFIT is planted by size: :data:`PLANTED_VOCAB` = 4,096 ids, so the key → value map (2,048 arbitrary pairs)
is more than the benchmark's trunks can store in their own weights (H ≤ 96: a hidden state cannot point at one
of 4,096 output rows per key without per-key parameters), while the table gives every key its own
``L·dP`` numbers. Measured before it became the benchmark's corpus (H = 32, dP = 16, 320 steps, 3 seeds): real
ids end 0.033–0.049 nats below the zero table and 0.044–0.060 below i.i.d. ids. With 512 ids the trunk learns the
same map and a table ends within ≈ 0.02 nats of a zeroed one. The benchmark still reads BENEFIT's truth from the
runs (other seeds' finals); its report checks that on this corpus the runs agree with the construction.
``gap`` = 2 (a skip-bigram, which needs attention) is not learned within the benchmark's 320 steps.

Written as one ``.npy`` shard (``plelab train --data planted.npy``); the same seed gives the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from plelab.io import atomic_write

TOKENS = 1 << 21
PLANTED_VOCAB = 4096
ZIPF = 1.0


def planted_tokens(tokens: int = TOKENS, vocab: int = PLANTED_VOCAB, gap: int = 1, p: float = 0.8,
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


def write_planted(path: str | Path, vocab: int = PLANTED_VOCAB, seed: int = 0) -> Path:
    """Write the planted corpus to ``path`` (``.npy``) unless it is there already (same seed, same bytes)."""
    path = Path(path)
    if not path.exists():
        ids = planted_tokens(vocab=vocab, seed=seed)
        atomic_write(path, lambda tmp: _save(tmp, ids))
    return path


def _save(path: Path, ids: np.ndarray) -> None:
    with open(path, "wb") as f:  # a file object: np.save would add ".npy" to the temporary file's name
        np.save(f, ids, allow_pickle=False)
