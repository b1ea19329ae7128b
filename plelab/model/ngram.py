"""A hashed n-gram table: the n-grams ending at each position looked up in one shared table, projected, and added
to the residual stream before every layer with a learned per-layer scale.

Equations (forms of modded-nanogpt's bigram hash embedding, ``records/track_1_short/2026-01-19_BigramHashEmbedding``
and ``train_gpt.py`` at commit f411b3d; of DeepSeek Engram's multi-head n-gram hashing, ``engram_demo_v1.py``,
arXiv 2601.07372; the row count after LongCat-Flash-Lite, arXiv 2601.21204):

    ngram_ids               input_ids [B,T]  ->  bucket ids [B,T,S],  S = len(orders)·K, slot s = i·K + k
        mix_{n,k}(t) = XOR_{j<n} (x_{t-j} · m(n,k,j))        x_{t-j} = PAD_TOKEN where t-j < 0 (the window's start)
        id_{n,k}(t)  = mix_{n,k}(t) mod R
    HashedNgramEmbedding    input_ids [B,T]  ->  y [B,T,H]                  (once per forward)
        y = W_proj · concat_s E[id_s]                        embed.weight [R,d], proj.weight [H, S·d]
    layer_term              h ← h + λ_l · y                  before layer l's block, every layer; lambdas [L]

The hash is causal (the id at t reads tokens t-n+1 … t only) and each window stands alone: the n-1 first positions
hash their n-gram with the missing predecessors read as the padding token ``PAD_TOKEN`` (Engram's pad_id rule),
never tokens of another window. Token ids are read modulo 2^32 (``TOKEN_MASK``); ``PAD_TOKEN`` = 2^32 - 1 is no
token of any vocabulary below 2^32 - 1 ids, so a padded n-gram differs from every real one (their buckets may
still collide, as any two n-grams' may). The multipliers are odd integers below 2^30 drawn from the seed by
splitmix64 (:func:`ngram_multipliers`), so every product stays below 2^62: plain int64 arithmetic, the same ids on
every device and in every process for the same seed. Heads are independent hashes (their own multipliers) into the
same rows; the heads' and orders' rows are concatenated (Engram's choice), so the projection tells them apart.
"""

from __future__ import annotations

import torch
from torch import nn

INITS = ("function-preserving", "modded")
TOKEN_MASK = (1 << 32) - 1  # token ids are hashed modulo 2^32
PAD_TOKEN = TOKEN_MASK  # the token a missing predecessor (before the window's start) reads as
_MASK64 = (1 << 64) - 1


def _splitmix64(z: int) -> int:
    """One splitmix64 step (Steele, Lea & Flood 2014): a bijective mix of a 64-bit integer."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def ngram_multipliers(seed: int, order: int, heads: int) -> tuple[tuple[int, ...], ...]:
    """The hash multipliers of one order, ``[heads][order]``: ``m(n,k,j) = (S(S(S(S(seed) ^ n) ^ k) ^ j) >> 34) | 1``
    with ``S`` = splitmix64 on ``seed mod 2^64`` — an odd integer below 2^30, a function of (seed, n, k, j) alone
    (adding an order or a head leaves the others' hashes as they were)."""
    base = _splitmix64(seed & _MASK64)
    out = []
    for k in range(heads):
        per_head = _splitmix64(_splitmix64(base ^ order) ^ k)
        out.append(tuple((_splitmix64(per_head ^ j) >> 34) | 1 for j in range(order)))
    return tuple(out)


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def ngram_rows(vocab_size: int, multiple: float = 5.0) -> int:
    """The table's row count near ``multiple · V``: the smallest prime ``>= round(multiple · V)`` (Python's round)
    other than V itself. A prime other than V is never an integer multiple of V, where LongCat-Flash-Lite reports
    collision spikes, and as the hash's modulus it mixes every bit of the products. Deterministic."""
    if vocab_size < 2:
        raise ValueError(f"ngram_rows needs a vocabulary of at least 2 ids, got {vocab_size}")
    if not multiple > 0:
        raise ValueError(f"ngram_rows needs a positive multiple of the vocabulary, got {multiple}")
    rows = max(2, round(multiple * vocab_size))
    while not _is_prime(rows) or rows == vocab_size:
        rows += 1
    return rows


def _check_hash(orders, heads: int, rows: int) -> tuple[int, ...]:
    orders = tuple(int(n) for n in orders)
    if not orders or len(set(orders)) != len(orders) or min(orders) < 2:
        raise ValueError(f"n-gram orders must be distinct integers >= 2, got {list(orders)}")
    if heads < 1 or rows < 1:
        raise ValueError(f"an n-gram hash needs heads >= 1 and rows >= 1, got heads={heads} and rows={rows}")
    return orders


def ngram_ids(input_ids: torch.Tensor, *, rows: int, orders=(2, 3), heads: int = 1, seed: int = 0) -> torch.Tensor:
    """The table rows of the n-grams ending at each position: ``input_ids [B,T]`` -> ``[B,T,len(orders)·heads]``
    (int64, in ``[0, rows)``; slot ``i·heads + k`` is order ``orders[i]``, head ``k``; see module doc)."""
    orders = _check_hash(orders, heads, rows)
    if input_ids.dim() != 2:
        raise ValueError(f"ngram_ids needs input_ids [B,T], got shape {tuple(input_ids.shape)}")
    x = input_ids.long() & TOKEN_MASK
    B, T = x.shape
    shifted = [x]  # shifted[j][:, t] = x[:, t-j], PAD_TOKEN before the window's start
    for j in range(1, max(orders)):
        pad = torch.full((B, min(j, T)), PAD_TOKEN, dtype=torch.int64, device=x.device)
        shifted.append(torch.cat((pad, x[:, :T - j]), dim=1))
    out = torch.empty(B, T, len(orders) * heads, dtype=torch.int64, device=x.device)
    for i, n in enumerate(orders):
        for k, mult in enumerate(ngram_multipliers(seed, n, heads)):
            mix = shifted[0] * mult[0]
            for j in range(1, n):
                mix = torch.bitwise_xor(mix, shifted[j] * mult[j])
            out[..., i * heads + k] = torch.remainder(mix, rows)
    return out


def count_collisions(token_ids: torch.Tensor, *, rows: int, orders=(2, 3), heads: int = 1,
                     seed: int = 0) -> dict[int, dict[str, int | tuple[int, ...]]]:
    """How the distinct n-grams of a corpus sample ``token_ids [N]`` (int, read as one window) share buckets.

    For each order ``n``, over the n-grams wholly inside the sample (no padded ones): ``ngrams`` (distinct n-grams),
    ``buckets`` (per head: distinct buckets they occupy), ``shared`` (per head: distinct n-grams whose bucket holds
    another of them too) and ``shared_all_heads`` (distinct n-grams with every head's bucket equal to another's).
    """
    if token_ids.dim() != 1:
        raise ValueError(f"count_collisions needs a 1-D sample of token ids [N], got shape {tuple(token_ids.shape)}")
    orders = _check_hash(orders, heads, rows)
    tokens = token_ids.long().cpu() & TOKEN_MASK
    buckets = ngram_ids(tokens[None], rows=rows, orders=orders, heads=heads, seed=seed)[0]
    report: dict[int, dict[str, int | tuple[int, ...]]] = {}
    for i, n in enumerate(orders):
        if len(tokens) < n:
            report[n] = {"ngrams": 0, "buckets": (0,) * heads, "shared": (0,) * heads, "shared_all_heads": 0}
            continue
        grams = tokens.unfold(0, n, 1)
        distinct, which = torch.unique(grams, dim=0, return_inverse=True)
        # every occurrence of an n-gram has the same buckets: any one of them stands for it
        per_gram = torch.zeros(len(distinct), heads, dtype=torch.int64)
        per_gram[which] = buckets[n - 1:, i * heads:(i + 1) * heads]
        used, shared = [], []
        for k in range(heads):
            _, counts = torch.unique(per_gram[:, k], return_counts=True)
            used.append(len(counts))
            shared.append(int(counts[counts > 1].sum()))
        _, counts = torch.unique(per_gram, dim=0, return_counts=True)
        report[n] = {"ngrams": len(distinct), "buckets": tuple(used), "shared": tuple(shared),
                     "shared_all_heads": int(counts[counts > 1].sum())}
    return report


def resolve_sizes(vocab_size: int, hidden_size: int, orders, heads: int, rows: int | None, dim: int | None,
                  multiple: float = 5.0) -> tuple[tuple[int, ...], int, int]:
    """``(orders, rows, dim)`` of a table: rows :func:`ngram_rows` (V, ``multiple``), dim ``H // (len(orders)·heads)``
    by default."""
    rows = ngram_rows(vocab_size, multiple) if rows is None else rows
    orders = _check_hash(orders, heads, rows)
    dim = max(1, hidden_size // (len(orders) * heads)) if dim is None else dim
    if dim < 1 or hidden_size < 1:
        raise ValueError(f"HashedNgramEmbedding needs dim >= 1 and hidden_size >= 1, got {dim} and {hidden_size}")
    return orders, rows, dim


def added_params(vocab_size: int, hidden_size: int, num_layers: int, orders=(2, 3), heads: int = 1,
                 rows: int | None = None, dim: int | None = None) -> int:
    """The exact parameter count of :class:`HashedNgramEmbedding` with these numbers:
    ``R·d + H·S·d + L`` (table, projection, per-layer scales; ``S = len(orders)·heads``)."""
    orders, rows, dim = resolve_sizes(vocab_size, hidden_size, orders, heads, rows, dim)
    return rows * dim + hidden_size * len(orders) * heads * dim + num_layers


def flops_per_token(vocab_size: int, hidden_size: int, num_layers: int, orders=(2, 3), heads: int = 1,
                    rows: int | None = None, dim: int | None = None) -> int:
    """Forward FLOPs per token of :class:`HashedNgramEmbedding`: ``2 · H · S · d`` (the projection, once per forward).

    Convention (as :mod:`plelab.model.accounting`): 2 × the multiply-adds of the matmuls only; the hash (integer
    arithmetic), the lookups and the per-layer ``λ_l · y`` and sums (``2·L·H`` element-wise) count 0. Training is 3×.
    """
    orders, rows, dim = resolve_sizes(vocab_size, hidden_size, orders, heads, rows, dim)
    return 2 * hidden_size * len(orders) * heads * dim


class HashedNgramEmbedding(nn.Module):
    """The hashed n-gram table, its projection and per-layer scales (see module doc).

    ``rows`` defaults to :func:`ngram_rows` (V) (≈ 5·V, modded-nanogpt's size); ``dim`` to ``H // (len(orders)·heads)``
    (the concatenated rows are then about H wide; with one order and one head, d = H as in modded-nanogpt).
    ``sparse`` gives the table sparse row gradients. Built with ``init="function-preserving"`` values.
    """

    def __init__(self, vocab_size: int, hidden_size: int, num_layers: int, orders=(2, 3), heads: int = 1,
                 rows: int | None = None, dim: int | None = None, seed: int = 0, sparse: bool = False) -> None:
        super().__init__()
        self.orders, self.rows, self.dim = resolve_sizes(vocab_size, hidden_size, orders, heads, rows, dim)
        if num_layers < 1:
            raise ValueError(f"HashedNgramEmbedding needs num_layers >= 1, got {num_layers}")
        self.heads, self.seed, self.num_layers = heads, seed, num_layers
        self.embed = nn.Embedding(self.rows, self.dim, sparse=sparse)
        self.proj = nn.Linear(len(self.orders) * heads * self.dim, hidden_size, bias=False)
        self.lambdas = nn.Parameter(torch.empty(num_layers))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None, std: float = 0.02,
                         init: str = "function-preserving", *, lambda_init: float = 0.1) -> None:
        """The per-layer scales at ``lambda_init`` (modded-nanogpt's 0.1) under both inits.

        ``"function-preserving"``: table normal(0, std), projection zero — y is exactly 0, so the model starts equal
        to the trunk; the projection gets a gradient at the first step, the table and scales from the second.
        ``"modded"`` (modded-nanogpt): table zero, projection the identity where it is square (one order, one head,
        d = H: exactly modded-nanogpt's unprojected table), normal(0, std) otherwise — y is again 0, and the table
        gets a gradient at the first step.
        """
        if init not in INITS:
            raise ValueError(f"unknown HashedNgramEmbedding init {init!r}: choose one of {', '.join(INITS)}")
        self.lambdas.fill_(lambda_init)
        table, proj = self.embed.weight, self.proj.weight
        if init == "function-preserving":
            table.normal_(0.0, std, generator=generator)
            proj.zero_()
            return
        table.zero_()
        if proj.shape[0] == proj.shape[1]:
            proj.copy_(torch.eye(proj.shape[0], dtype=proj.dtype, device=proj.device))
        else:
            proj.normal_(0.0, std, generator=generator)

    def blank(self) -> HashedNgramEmbedding:
        """A new module of this one's sizes and hash, on the CPU in float32 (values: :meth:`reset_parameters`')."""
        with torch.random.fork_rng(devices=[]):
            # the vocabulary only chooses the rows when none are given: they are given here
            return HashedNgramEmbedding(self.rows, self.proj.out_features, self.num_layers, orders=self.orders,
                                        heads=self.heads, rows=self.rows, dim=self.dim, seed=self.seed)

    def ngram_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """This table's bucket ids: ``input_ids [B,T]`` -> ``[B,T,S]`` (:func:`ngram_ids`)."""
        return ngram_ids(input_ids, rows=self.rows, orders=self.orders, heads=self.heads, seed=self.seed)

    def forward(self, input_ids: torch.Tensor, bucket_ids: torch.Tensor | None = None) -> torch.Tensor:
        """``y = W_proj · concat_s E[id_s]``: ``input_ids [B,T]`` -> ``[B,T,H]``. ``bucket_ids [B,T,S]`` (e.g.
        hashed in the data loader, as modded-nanogpt does) replaces the hash when given."""
        ids = self.ngram_ids(input_ids) if bucket_ids is None else bucket_ids
        slots = len(self.orders) * self.heads
        if tuple(ids.shape) != (*input_ids.shape, slots):
            raise ValueError(f"bucket_ids must be [B,T,{slots}] for input_ids {tuple(input_ids.shape)}, got "
                             f"{tuple(ids.shape)}")
        return self.proj(self.embed(ids).flatten(-2))

    def layer_term(self, y: torch.Tensor, layer: int) -> torch.Tensor:
        """``λ_l · y`` ``[B,T,H]``: added to the residual stream h before layer ``layer``'s block."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} is outside the model's {self.num_layers} layers")
        return self.lambdas[layer] * y
