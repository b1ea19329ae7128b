"""The ``aux`` section of a run config (:class:`AuxConfig`): which token-indexed table a run adds to its trunk.

The table family of issue 56 under one harness: ``aux.kind=ple`` is the per-layer embedding sized by ``ple.dim``
(``ple.dim=0``: the trunk alone, every study's baseline); ``value``, ``ngram`` and ``modulation`` are the other
kinds (:mod:`plelab.model.value_embed`, :mod:`plelab.model.ngram`, :mod:`plelab.model.modulation`), each with
``ple.dim=0``: one mechanism per run, so that each is compared with the same trunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from plelab.config.checks import _ADVISE, _require, _require_choice
from plelab.errors import ConfigError

AuxKind = Literal["ple", "value", "ngram", "modulation"]
TableIds = Literal["token", "iid"]  # what keys a table: the real ids, or the null control's i.i.d. draws
AuxInit = Literal["function-preserving", "native"]
AUX_KINDS: tuple[str, ...] = get_args(AuxKind)
# the keys each kind reads (besides kind and init); a key of another kind set away from its default is refused
AUX_KEYS = {"value": ("layers", "gate_channels"),
            "ngram": ("orders", "heads", "rows", "rows_multiple", "dim", "hash_seed"),
            "modulation": ("layers",)}


@dataclass
class AuxConfig:
    """The run's token-indexed table besides the main embedding (see the module doc)."""

    # ple: the per-layer embedding (ple.dim; 0 = none); value: nanochat's value embeddings; ngram: a hashed n-gram
    # table (Engram / modded-nanogpt); modulation: a per-layer token modulation h ⊙ (1 + m_l[x]) of the MLP output.
    kind: AuxKind = field(default="ple", metadata=_ADVISE)
    # function-preserving: the model starts equal to its trunk (value/modulation tables zero, the n-gram projection
    # zero); native: each source's own init (nanochat's uniform value tables; modded-nanogpt's zero n-gram table
    # with an identity projection where square; a normal modulation table).
    init: AuxInit = field(default="function-preserving", metadata=_ADVISE)
    # What keys the table, as ple.ids for PLE: "token" (the ids, or the n-gram's buckets), or "iid" — the null control,
    # every lookup drawn i.i.d. from the real rows' frequencies (bucket frequencies for the n-gram table).
    ids: TableIds = field(default="token", metadata=_ADVISE)
    # value: the layers with a value embedding; empty = nanochat's rule (every other layer, the last included).
    # modulation: the modulated layers; empty = every layer.
    layers: list[int] = field(default_factory=list, metadata=_ADVISE)
    # value: the channels of the attention input that the per-head gate 3·sigmoid(W x[..., :c]) reads (nanochat 12).
    gate_channels: int = field(default=12, metadata=_ADVISE)
    # ngram: the n-gram orders hashed at each position, and the independent hash heads per order.
    orders: list[int] = field(default_factory=lambda: [2, 3], metadata=_ADVISE)
    heads: int = field(default=1, metadata=_ADVISE)
    # ngram: table rows; none = the smallest prime >= rows_multiple·V (never a multiple of V: LongCat-Flash-Lite's
    # collision spikes), 5·V by default (modded-nanogpt's size).
    rows: int | None = field(default=None, metadata=_ADVISE)
    rows_multiple: float = field(default=5.0, metadata=_ADVISE)
    # ngram: the width of a looked-up row; none = H // (len(orders)·heads).
    dim: int | None = field(default=None, metadata=_ADVISE)
    # ngram: the hash's seed (fixed across a study's seeds: the seeds vary the init, not which n-grams share rows).
    hash_seed: int = field(default=0, metadata=_ADVISE)

    @property
    def extra(self) -> bool:
        """Whether the run has a table of a kind other than PLE."""
        return self.kind != "ple"

    def validate(self, num_layers: int, hidden_size: int, vocab_size: int) -> None:
        _require_choice(self.kind, "aux.kind", AuxKind)
        _require_choice(self.init, "aux.init", AuxInit)
        _require_choice(self.ids, "aux.ids", TableIds)
        _require(self.ids == "token" or self.extra, "aux.ids", self.ids, "token under aux.kind=ple (PLE's null "
                 "control is ple.ids=iid)")
        _require(all(0 <= layer < num_layers for layer in self.layers) and len(set(self.layers)) == len(self.layers),
                 "aux.layers", self.layers, f"distinct layer indices in [0, {num_layers}), or empty (value: "
                 "nanochat's rule; modulation: every layer)")
        _require(1 <= self.gate_channels <= hidden_size, "aux.gate_channels", self.gate_channels,
                 f"an integer from 1 to model.hidden_size ({hidden_size})")
        _require(bool(self.orders) and all(n >= 2 for n in self.orders) and len(set(self.orders)) == len(self.orders),
                 "aux.orders", self.orders, "distinct n-gram orders >= 2, e.g. 2,3")
        _require(self.heads >= 1, "aux.heads", self.heads, "an integer >= 1")
        _require(self.rows is None or (self.rows >= 2 and self.rows % vocab_size != 0), "aux.rows", self.rows,
                 f"an integer >= 2 that is not a multiple of model.vocab_size ({vocab_size}: collision spikes), or "
                 "none for the smallest prime >= aux.rows_multiple·V")
        _require(self.rows_multiple > 0, "aux.rows_multiple", self.rows_multiple, "a number > 0")
        _require(self.dim is None or self.dim >= 1, "aux.dim", self.dim, "an integer >= 1, or none for H // slots")
        _require(0 <= self.hash_seed < 2 ** 63, "aux.hash_seed", self.hash_seed, "an integer from 0 to 2**63 - 1")
        defaults = AuxConfig()
        for kind, keys in AUX_KEYS.items():
            for key in keys if kind != self.kind else ():
                if key in AUX_KEYS.get(self.kind, ()):  # a key this kind reads too (layers: value and modulation)
                    continue
                if getattr(self, key) != getattr(defaults, key):
                    readers = [k for k, read in AUX_KEYS.items() if key in read]  # layers: value and modulation
                    raise ConfigError(f"aux.{key}={getattr(self, key)!r} sizes the {' or '.join(readers)} table, "
                                      f"but aux.kind={self.kind}: drop it, or set aux.kind="
                                      f"{' or aux.kind='.join(readers)}")
