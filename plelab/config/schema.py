"""Dataclass configs: model trunk, PLE, training, data — and the run config that holds them (the visual section
is :mod:`plelab.config.visual_schema`).

Every field has a default and a one-line comment; every section validates itself and raises
:class:`~plelab.errors.ConfigError` with a one-line message naming the field and the allowed
values. Configs are plain dataclasses so that they are importable without the CLI and serialise
to JSON exactly (``to_dict``/``from_dict``). Choices are declared once, as ``Literal`` types (the
``*_KINDS`` / ``*_IDS`` tuples are read from them). Field tags (``metadata=tags(...)``) say which keys
a purpose compares (:func:`plelab.config.keys_tagged`):

- ``resume``: what a resumed run must share with its checkpoint (it changes what a step computes);
- ``advise``: what a configuration must share with a sweep for ``plelab advise`` to apply its measurements;
- ``sweep_data``: what the prepared data of a run depend on (sweep runs with equal values share them);
- ``visual_ids`` / ``quantizer_ids``: what a run's visual IDs depend on (the second only for online quantizers).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal, get_args

from plelab.config.checks import (_ADVISE, _ADVISE_PATH, _DATA, _PATH, _RESUME, _RESUME_ADVISE, _require,
                                  _require_choice)
from plelab.config.aux_schema import AUX_KINDS, AuxConfig, TableIds
from plelab.config.overrides import load_dict, tags
from plelab.config.visual_schema import QUANTIZER_IDS, VISUAL_IDS, Injection, QuantizerIds, VisualConfig, VisualIds
from plelab.errors import ConfigError

GateKind = Literal["gemma", "scalar", "vector", "none"]
VocabRemap = Literal["none", "frequency"]
TableMode = Literal["learned", "frozen", "zero"]
TableOptimizer = Literal["adamw", "row-sparse"]
TableDevice = Literal["auto", "cpu"]
Precision = Literal["auto", "fp32", "bf16"]
Parallel = Literal["ddp", "fsdp"]
EmbeddedCorpus = Literal["stdlib", "packages"]
GATE_KINDS: tuple[str, ...] = get_args(GateKind)
# Kinds of run (RunConfig.kind) -> the package that registers each (plelab.training.task imports it on first use, so
# that a config of one kind never loads another kind's package).
KIND_MODULES = {"text": "plelab.training.text_task", "visual": "plelab.visual"}


def _is_factory(text: str) -> bool:
    module, sep, function = text.partition(":")
    return bool(sep) and all(part.isidentifier() for part in module.split(".")) and function.isidentifier()



@dataclass
class ModelConfig:
    """The decoder-only trunk (Llama-style block: RMSNorm, RoPE, GQA, SwiGLU).

    Names follow HF (``hidden_size``, ``num_hidden_layers``, ...). ``head_dim`` of ``None``
    means ``hidden_size // num_attention_heads``.
    """

    vocab_size: int = field(default=512, metadata=_DATA)
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int | None = None
    intermediate_size: int = 176
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    # Gemma convention: the main embedding is multiplied by sqrt(hidden_size) before layer 0.
    scale_embeddings: bool = True
    # HF `_init_weights`: normal(0, initializer_range) for Linear/Embedding, ones for norms.
    initializer_range: float = 0.02
    # The trunk PLE is added to, when it is not this Llama-style decoder (plelab.training.hosts): an HF decoder
    # built by transformers from this config.json (PLE attached as plelab.attach does; the trunk fields above are
    # read from it), or "module:function" — your own PyTorch model, built per run by function(cfg).
    hf_config: str | None = field(default=None, metadata=_PATH)
    factory: str | None = None

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    def validate(self) -> None:
        _require(self.vocab_size >= 2, "model.vocab_size", self.vocab_size, "an integer >= 2")
        _require(self.hidden_size >= 1, "model.hidden_size", self.hidden_size, "an integer >= 1")
        _require(self.num_hidden_layers >= 1, "model.num_hidden_layers", self.num_hidden_layers, "an integer >= 1")
        _require(self.num_attention_heads >= 1, "model.num_attention_heads", self.num_attention_heads,
                 "an integer >= 1")
        _require(self.hidden_size % self.num_attention_heads == 0, "model.num_attention_heads",
                 self.num_attention_heads, f"a divisor of model.hidden_size={self.hidden_size}")
        _require(self.num_key_value_heads >= 1
                 and self.num_attention_heads % self.num_key_value_heads == 0,
                 "model.num_key_value_heads", self.num_key_value_heads,
                 f"a divisor of model.num_attention_heads={self.num_attention_heads}")
        hd = self.resolved_head_dim
        _require(hd >= 2 and hd % 2 == 0, "model.head_dim", self.head_dim, "an even integer >= 2 (RoPE rotates pairs)")
        _require(self.intermediate_size >= 1, "model.intermediate_size", self.intermediate_size, "an integer >= 1")
        _require(self.rope_theta > 0, "model.rope_theta", self.rope_theta, "a number > 0")
        _require(self.rms_norm_eps > 0, "model.rms_norm_eps", self.rms_norm_eps, "a number > 0")
        _require(self.initializer_range > 0, "model.initializer_range", self.initializer_range, "a number > 0")
        _require(not (self.hf_config and self.factory), "model.factory", self.factory,
                 "none when model.hf_config is set (one trunk: an HF config or your factory)")
        _require(self.factory is None or _is_factory(self.factory), "model.factory", self.factory,
                 "MODULE:FUNCTION, e.g. mymodels.gpt:build (the module importable from PYTHONPATH)")
        _require(self.hf_config is None or bool(self.hf_config), "model.hf_config", self.hf_config,
                 "the path of an HF config.json (or the folder holding it), or none")

    @property
    def host(self) -> str:
        """The trunk's kind: ``plelab`` (this decoder), ``hf`` (``hf_config``) or ``factory``."""
        return "hf" if self.hf_config else "factory" if self.factory else "plelab"


@dataclass
class PLEConfig:
    """Per-Layer Embeddings, Gemma 3n / Gemma 4 layout (``docs/ple.md`` §1.2–1.4).

    ``dim`` is dP (HF: ``hidden_size_per_layer_input``); 0 switches PLE off and gives
    exactly the baseline trunk. ``vocab_size`` is Vp (HF: ``vocab_size_per_layer_input``);
    ``None`` means the main vocabulary size. With ``vocab_remap="none"`` token ids >= Vp look up row 0, as
    Gemma 3n does; ``"frequency"`` gives the Vp − 1 most frequent ids (training split) their own rows and lets
    the rest share row 0 (:func:`plelab.model.ple.frequency_rows`; the map is the model's
    ``model.per_layer_token_rows`` buffer, saved with every checkpoint).
    """

    dim: int = 0
    vocab_size: int | None = field(default=None, metadata=_ADVISE)
    vocab_remap: VocabRemap = field(default="none", metadata=_ADVISE)
    # gemma: RMSNorm_H(W_p(gelu_tanh(W_g h) * p_l)); scalar/vector: g_l * W_p p_l (the seed's
    # form, learned scalar or H-vector g_l); none: W_p p_l.
    gate: GateKind = field(default="gemma", metadata=_ADVISE)
    # Initial value of the learned gate g_l (scalar/vector gates only).
    gate_init: float = field(default=1.0, metadata=_ADVISE)
    # Whether the learned gate trains; false holds it at gate_init (gate_init=0 closes the branch: the calibration
    # benchmark's "gate held at 0" negative, whose table gets no gradient).
    gate_learn: bool = field(default=True, metadata=_ADVISE)
    # Std of the per-layer table's init; None means model.initializer_range.
    table_init_std: float | None = field(default=None, metadata=_ADVISE)
    # What keys the table: "token" (the real ids), or "iid" — a null control whose ids are drawn
    # i.i.d. for every occurrence from the real ids' frequencies, so that they carry no information.
    ids: TableIds = field(default="token", metadata=_ADVISE)
    # Controls of the dP study: "learned" (trained), "frozen" (kept at its random init — is a gain a
    # regularisation side effect?), "zero" (all zeros, frozen: only the model-level projection path remains).
    table: TableMode = field(default="learned", metadata=_ADVISE)
    # The lookup is multiplied by table_scale · sqrt(table_scale_dim or dim). Gemma: sqrt(dP), so the
    # table's share of the per-layer input and its effective step size grow with dP; a fixed
    # table_scale_dim holds both constant across dP (the scale-matched arm); table_scale > 1 boosts it.
    table_scale: float = field(default=1.0, metadata=_ADVISE)
    table_scale_dim: int | None = field(default=None, metadata=_ADVISE)

    @property
    def embed_scale(self) -> float:
        """The multiplier of the table lookup ``z = scale · T[x]`` (Gemma: ``sqrt(dP)``)."""
        return self.table_scale * (self.table_scale_dim if self.table_scale_dim is not None else self.dim) ** 0.5

    @property
    def enabled(self) -> bool:
        return self.dim > 0

    def resolved_vocab_size(self, model: ModelConfig) -> int:
        return self.vocab_size if self.vocab_size is not None else model.vocab_size

    def validate(self, model: ModelConfig) -> None:
        _require(self.dim >= 0, "ple.dim", self.dim, "an integer >= 0 (0 = PLE off)")
        _require(self.vocab_size is None or self.vocab_size >= 2, "ple.vocab_size", self.vocab_size,
                 "an integer >= 2, or none for model.vocab_size")
        _require_choice(self.vocab_remap, "ple.vocab_remap", VocabRemap)
        if self.vocab_remap == "frequency" and not (self.vocab_size is not None and self.vocab_size < model.vocab_size):
            raise ConfigError(f"ple.vocab_remap=frequency keeps the most frequent ids in a smaller table, but "
                              f"ple.vocab_size is {self.vocab_size} with model.vocab_size {model.vocab_size}: set "
                              "ple.vocab_size below model.vocab_size, or ple.vocab_remap=none")
        _require_choice(self.gate, "ple.gate", GateKind)
        if not self.gate_learn and self.gate not in ("scalar", "vector"):
            raise ConfigError(f"ple.gate_learn=false holds a learned gate fixed, but ple.gate is {self.gate!r}, "
                              "which has none: set ple.gate=scalar or ple.gate=vector, or ple.gate_learn=true")
        _require_choice(self.ids, "ple.ids", TableIds)
        _require_choice(self.table, "ple.table", TableMode)
        _require(self.table_scale > 0, "ple.table_scale", self.table_scale, "a number > 0")
        _require(self.table_scale_dim is None or self.table_scale_dim >= 1, "ple.table_scale_dim",
                 self.table_scale_dim, "an integer >= 1, or none for ple.dim (Gemma's sqrt(dP))")
        _require(self.table_init_std is None or self.table_init_std > 0, "ple.table_init_std",
                 self.table_init_std, "a number > 0, or none for model.initializer_range")


@dataclass
class TrainConfig:
    """Optimisation and loop settings."""

    steps: int = field(default=200, metadata=_ADVISE)
    # Global batch in sequences per optimizer step, over all ranks and accumulation micro-steps.
    batch_size: int = field(default=8, metadata=_RESUME_ADVISE)
    grad_accum: int = 1
    seq_len: int = field(default=64, metadata=_RESUME_ADVISE)
    lr: float = field(default=3e-3, metadata=_ADVISE)
    # Learning rate and weight decay of the per-layer table's own parameter group.
    # None for table_lr means the same as lr; embedding tables get no weight decay by default.
    table_lr: float | None = field(default=None, metadata=_ADVISE)
    # Multiplies the table group's learning rate (the dP study's table-lr control arms).
    table_lr_mult: float = field(default=1.0, metadata=_ADVISE)
    weight_decay: float = field(default=0.1, metadata=_ADVISE)
    table_weight_decay: float = field(default=0.0, metadata=_ADVISE)
    # The per-layer table's update: "adamw" (dense, the default: earlier studies stay comparable) or
    # "row-sparse" (sparse row gradients, only the looked-up rows updated; plelab.training.sparse).
    table_optimizer: TableOptimizer = field(default="adamw", metadata=_RESUME)
    # Where the per-layer table and its optimizer state live: "auto" (with the trunk) or "cpu" (host
    # memory while the trunk runs on the accelerator; the batch's rows are copied over each step).
    table_device: TableDevice = "auto"
    warmup_steps: int = field(default=20, metadata=_ADVISE)
    min_lr_ratio: float = field(default=0.1, metadata=_ADVISE)
    grad_clip: float = 1.0
    # Steps with a non-finite loss or gradient that may be skipped (no update) before the run stops; 0 = stop
    # at the first (with the layer and step named). Skipped steps are logged and counted in summary.json; the
    # data position still advances (their batch is not retried) and tokens_seen counts their tokens.
    skip_nonfinite: int = 0
    eval_every: int = 50
    eval_batches: int = 8
    log_every: int = 10
    # Checkpoint every N steps (and at the end); keep the newest keep_checkpoints of them.
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    # Also checkpoint at this step and never delete it (the sweep's early verdict; 0 = none).
    early_checkpoint: int = 0
    device: str = "auto"
    # auto: bf16 autocast on CUDA; on CPU bf16 only with bf16 matrix flags and a probe that finds it faster
    # (plelab.precision); studies: fp32 on CPU. config.json records the resolved value.
    precision: Precision = field(default="auto", metadata=_RESUME)
    compile: bool = False
    # Multi-process wrapping under torchrun: DDP, or FSDP2 (fully_shard on the meta device, sharded init and
    # sharded checkpoints) for large models.
    parallel: Parallel = "ddp"
    # Recompute each decoder layer's activations in backward instead of keeping them (same losses, less memory).
    activation_checkpointing: bool = False
    # CPU threads for torch; 0 means all cores of this machine (divided among local ranks).
    threads: int = 0
    tensorboard: bool = False
    wandb_project: str | None = None
    # Cheap PLE signal metrics (SNR, gate, gradient norms...) every N steps into metrics.jsonl (0 = off);
    # the full structure + use diagnostics at every checkpoint, the use test on this many windows (0 = off).
    diag_every: int = 50
    diag_windows: int = 64

    def validate(self) -> None:
        _require(self.steps >= 1, "train.steps", self.steps, "an integer >= 1")
        _require(self.batch_size >= 1, "train.batch_size", self.batch_size, "an integer >= 1")
        _require(self.grad_accum >= 1 and self.batch_size % self.grad_accum == 0, "train.grad_accum", self.grad_accum,
                 f"an integer >= 1 dividing train.batch_size={self.batch_size}")
        _require(self.seq_len >= 2, "train.seq_len", self.seq_len, "an integer >= 2")
        _require(self.lr > 0, "train.lr", self.lr, "a number > 0")
        _require(self.table_lr is None or self.table_lr >= 0, "train.table_lr", self.table_lr,
                 "a number >= 0, or none for train.lr")
        _require(self.table_lr_mult >= 0, "train.table_lr_mult", self.table_lr_mult, "a number >= 0")
        _require(self.weight_decay >= 0, "train.weight_decay", self.weight_decay, "a number >= 0")
        _require(self.table_weight_decay >= 0, "train.table_weight_decay", self.table_weight_decay, "a number >= 0")
        _require(self.warmup_steps >= 0, "train.warmup_steps", self.warmup_steps, "an integer >= 0")
        _require(0 <= self.min_lr_ratio <= 1, "train.min_lr_ratio", self.min_lr_ratio, "a number in [0, 1]")
        _require(self.grad_clip >= 0, "train.grad_clip", self.grad_clip, "a number >= 0 (0 = off)")
        _require(self.skip_nonfinite >= 0, "train.skip_nonfinite", self.skip_nonfinite, "an integer >= 0 (0 = stop)")
        _require(self.eval_every >= 1, "train.eval_every", self.eval_every, "an integer >= 1")
        _require(self.eval_batches >= 1, "train.eval_batches", self.eval_batches, "an integer >= 1")
        _require(self.log_every >= 1, "train.log_every", self.log_every, "an integer >= 1")
        _require(self.checkpoint_every >= 0, "train.checkpoint_every", self.checkpoint_every,
                 "an integer >= 0 (0 = only at the end)")
        _require(0 <= self.early_checkpoint <= self.steps, "train.early_checkpoint", self.early_checkpoint,
                 f"an integer in [0, train.steps={self.steps}] (0 = none)")
        _require(self.keep_checkpoints >= 1, "train.keep_checkpoints", self.keep_checkpoints, "an integer >= 1")
        _require(self.diag_every >= 0, "train.diag_every", self.diag_every, "an integer >= 0 (0 = off)")
        _require(self.diag_windows >= 0, "train.diag_windows", self.diag_windows, "an integer >= 0 (0 = off)")
        _require(self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"), "train.device",
                 self.device, "auto | cpu | cuda | cuda:N")
        _require(self.threads >= 0, "train.threads", self.threads, "an integer >= 0 (0 = all cores)")
        _require_choice(self.table_optimizer, "train.table_optimizer", TableOptimizer)
        _require_choice(self.table_device, "train.table_device", TableDevice)
        _require(self.parallel == "ddp" or (self.table_optimizer == "adamw" and self.table_device == "auto"),
                 "train.parallel", self.parallel, "ddp with train.table_optimizer=row-sparse or "
                 "train.table_device=cpu (FSDP2 shards the table densely)")
        _require(not self.compile or (self.table_optimizer == "adamw" and self.table_device == "auto"),
                 "train.compile", self.compile, "false with train.table_optimizer=row-sparse or train.table_device=cpu "
                 "(sparse gradients and the host-side table are not compiled)")


OTHER_LIBRARIES = "other-libraries"  # data.ood's built-in set (plelab.data.ood), a name rather than a path


@dataclass
class DataConfig:
    """Where the training tokens come from: text (streamed into token shards) or pre-tokenized shards."""

    # None means the embedded default corpus (the interpreter's own documentation). Text: a .txt/.md, .jsonl
    # (.gz/.zst), .parquet file, a folder of them, or a HF datasets folder; tokens: a .bin/.npy file or folder.
    path: str | None = field(default=None, metadata=_ADVISE_PATH)
    # Which embedded corpus when there is no path: stdlib (the interpreter's documentation, the default) or
    # packages (that, then the docstrings of torch, numpy, scipy, matplotlib, sympy, mpmath, networkx: ≈ 23 M chars).
    embedded: EmbeddedCorpus = field(default="stdlib", metadata=_ADVISE)
    # A mixture instead of one path: PATH:WEIGHT entries (weights normalised), e.g. ["web/:0.7", "code/:0.3"].
    mix: list[str] = field(default_factory=list, metadata=_ADVISE_PATH)
    # Field (JSONL) or column (Parquet, HF datasets) that holds the text.
    text_field: str = "text"
    # An existing tokenizer.json; None trains a byte-level BPE on a sample of the corpus (cached).
    tokenizer: str | None = field(default=None, metadata=_ADVISE_PATH)
    val_fraction: float = field(default=0.05, metadata=_ADVISE)
    # Characters of text the BPE is trained on at most (a streamed, hash-drawn sample; the embedded corpus fits).
    tokenizer_sample_chars: int = field(default=100_000_000, metadata=_ADVISE)
    # The id type of .bin token shards (nanoGPT writes uint16); .npy files carry their own.
    token_dtype: Literal["uint16", "uint32"] | None = None
    # Pre-tokenized folders: the shard held out for validation (its file name); None = a val_fraction of blocks.
    val_shard: str | None = field(default=None, metadata=_ADVISE)
    # An out-of-distribution validation set scored at every evaluation beside the validation split (ood_loss):
    # "other-libraries" (docstrings of installed libraries neither embedded corpus holds) or a path to text.
    ood: str | None = field(default=None, metadata=_ADVISE_PATH)

    def validate(self) -> None:
        _require(0 < self.val_fraction < 1, "data.val_fraction", self.val_fraction, "a number in (0, 1)")
        _require(bool(self.text_field), "data.text_field", self.text_field, "a non-empty field name")
        _require(self.tokenizer_sample_chars >= 1_000, "data.tokenizer_sample_chars", self.tokenizer_sample_chars,
                 "an integer >= 1000")
        _require(not (self.mix and self.path), "data.mix", self.mix, "empty when data.path is set (give one or the "
                 "other: --data PATH, or --data PATH:WEIGHT twice or more)")
        _require_choice(self.embedded, "data.embedded", EmbeddedCorpus)
        _require(self.ood is None or (isinstance(self.ood, str) and bool(self.ood.strip())), "data.ood", self.ood,
                 "other-libraries or a path to text outside the training corpus")
        _require(self.embedded == "stdlib" or not (self.path or self.mix), "data.embedded", self.embedded,
                 "stdlib when --data is given (the embedded corpus is read only without a data path)")


@dataclass
class RunConfig:
    """Everything one run needs. Saved as ``RUN/config.json`` with every run."""

    preset: str = "cpu-tiny"
    # What kind of run this is (plelab.training.task.Kind): "text" (a language model on text), or "visual" (visual
    # PLE on image–caption pairs; older configs said visual.enabled=true, which still reads as this).
    kind: str = field(default="text", metadata=tags("resume", "sweep_data", "advise"))
    seed: int = field(default=0, metadata=_RESUME)
    model: ModelConfig = field(default_factory=ModelConfig, metadata=_RESUME_ADVISE)
    ple: PLEConfig = field(default_factory=PLEConfig, metadata=_RESUME)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig, metadata=_DATA)
    # The run's token-indexed table: PLE (ple.dim) or another kind of the family (plelab.config.aux_schema).
    aux: AuxConfig = field(default_factory=AuxConfig, metadata=_RESUME)
    visual: VisualConfig = field(default_factory=VisualConfig, metadata=_RESUME)

    def validate(self) -> RunConfig:
        _require(0 <= self.seed < 2 ** 63, "seed", self.seed, "an integer from 0 to 2**63 - 1 (a torch generator seed)")
        self.model.validate()
        self.ple.validate(self.model)
        self.train.validate()
        self.data.validate()
        _require(self.kind in KIND_MODULES, "kind", self.kind, " | ".join(KIND_MODULES))
        self.aux.validate(self.model.num_hidden_layers, self.model.hidden_size, self.model.vocab_size)
        if self.aux.extra:
            _require(not self.ple.enabled, "ple.dim", self.ple.dim, f"0 under aux.kind={self.aux.kind} (one table "
                     "kind per run, each compared with the same trunk): set ple.dim=0, or aux.kind=ple")
            _require(self.kind == "text", "aux.kind", self.aux.kind, "ple in a visual run")
            _require(self.model.host == "plelab", "aux.kind", self.aux.kind,
                     "ple on a host trunk (model.hf_config / model.factory): the other kinds are built into "
                     "plelab's decoder")
            _require(self.train.table_optimizer == "adamw" and self.train.table_device == "auto",
                     "train.table_optimizer", self.train.table_optimizer, f"adamw (and train.table_device=auto) under "
                     f"aux.kind={self.aux.kind}: the row-sparse optimizer and the host-kept table are PLE's")
            _require(self.train.parallel == "ddp", "train.parallel", self.train.parallel,
                     f"ddp under aux.kind={self.aux.kind} (its tables are not sharded yet)")
        self.visual.validate()
        if self.kind == "visual":
            _require(not self.visual.per_layer_table or self.ple.enabled, "visual.ids", self.visual.ids,
                     "none when ple.dim=0 (the visual table is a per-layer table: set ple.dim > 0, or "
                     "visual.table=false / visual.injection=layer0)")
            _require(self.ple.ids == "token", "ple.ids", self.ple.ids, "token in a visual run (use visual.ids=random)")
            _require(self.ple.vocab_remap == "none", "ple.vocab_remap", self.ple.vocab_remap,
                     "none in a visual run (its caption table keeps Gemma's rule)")
            _require(self.train.table_optimizer == "adamw" and self.train.table_device == "auto",
                     "train.table_optimizer", self.train.table_optimizer,
                     "adamw (and train.table_device=auto) in a visual run: its tables are small and dense")
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        """Build from a dict such as a saved ``config.json`` (keys it lacks keep their defaults); unknown keys
        and wrong types are errors."""
        return load_dict(cls(), d)


__all__ = ["AUX_KINDS", "GATE_KINDS", "AuxConfig", "QUANTIZER_IDS", "VISUAL_IDS", "DataConfig", "Injection", "ModelConfig", "PLEConfig",
           "QuantizerIds", "RunConfig", "TrainConfig", "VisualConfig", "VisualIds"]
