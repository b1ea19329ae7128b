"""plelab's PLE model as a transformers model: ``PlelabConfig`` (``model_type="plelab"``) and
``PlelabForCausalLM``, registered with ``AutoConfig`` / ``AutoModelForCausalLM`` (no remote code).

``import plelab`` registers them the moment transformers is imported (before or after plelab), so a folder
``plelab export`` wrote loads with ``AutoModelForCausalLM.from_pretrained(folder)`` and generates with HF's
``generate()``. The network is plelab's own :class:`~plelab.model.transformer.PLETextModel`, built from the
config's ``plelab`` entry (the run's ``model``, ``ple`` and ``aux`` sections): tensor names, numerics and logits are the
plelab checkpoint's. HF's ``DynamicCache`` serves as the KV cache (the attention only calls ``update`` and
``get_seq_length`` on it). Padding is not supported: an ``attention_mask`` with zeros is refused.

Classes are made on first use (:func:`classes`): defining a ``PreTrainedModel`` imports transformers' modeling
code (seconds), which only a user of transformers should pay for.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, fields

import torch
import torch.nn.functional as F
from torch import nn

from plelab.config.aux_schema import AuxConfig
from plelab.config.schema import ModelConfig, PLEConfig
from plelab.errors import PlelabError
from plelab.model.layers import RMSNorm
from plelab.model.transformer import PLETextModel

MODEL_TYPE = "plelab"


def require_transformers(what: str):
    """``transformers``, or a one-line error naming what needed it and how to install it."""
    try:
        import transformers  # optional dependency (the hf extra)
    except ModuleNotFoundError:
        raise PlelabError(f"{what} needs transformers: pip install 'plelab[hf]'") from None
    return transformers


class quiet_transformers:
    """transformers' logging and progress bars off inside the block (its loading bars would break plelab's output)."""

    def __enter__(self):
        self.t = require_transformers("loading an HF model")
        self.level = self.t.logging.get_verbosity()
        self.t.logging.set_verbosity_error()
        self.t.utils.logging.disable_progress_bar()
        return self.t

    def __exit__(self, *exc) -> None:
        self.t.logging.set_verbosity(self.level)
        self.t.utils.logging.enable_progress_bar()


def model_configs(entry: dict) -> tuple[ModelConfig, PLEConfig, AuxConfig]:
    """The ``(ModelConfig, PLEConfig, AuxConfig)`` a config's ``plelab`` entry ``{"model": {...}, "ple": {...},
    "aux": {...}}`` describes (``aux`` absent: PLE, as every folder exported before the table family)."""
    def build(cls, values: dict):
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"the plelab config entry has unknown {cls.__name__} keys {unknown}; export the run again "
                             "with this plelab version")
        return cls(**values)
    mc, pc = build(ModelConfig, entry.get("model", {})), build(PLEConfig, entry.get("ple", {}))
    ac = build(AuxConfig, entry.get("aux", {}))
    mc.validate()
    pc.validate(mc)
    ac.validate(mc.num_hidden_layers, mc.hidden_size, mc.vocab_size)
    return mc, pc, ac


def hf_config_fields(mc: ModelConfig, pc: PLEConfig) -> dict:
    """The standard HF config names for a plelab model (read by HF tools, by ``plelab diagnose`` and by caches)."""
    out = {"vocab_size": mc.vocab_size, "hidden_size": mc.hidden_size, "num_hidden_layers": mc.num_hidden_layers,
           "num_attention_heads": mc.num_attention_heads, "num_key_value_heads": mc.num_key_value_heads,
           "head_dim": mc.resolved_head_dim, "intermediate_size": mc.intermediate_size, "rope_theta": mc.rope_theta,
           "rms_norm_eps": mc.rms_norm_eps, "initializer_range": mc.initializer_range}
    if pc.enabled:
        out.update(hidden_size_per_layer_input=pc.dim, vocab_size_per_layer_input=pc.resolved_vocab_size(mc))
    return out


@functools.cache
def classes():
    """``(PlelabConfig, PlelabForCausalLM)``, defined once (this imports transformers' modeling code)."""
    import transformers  # optional dependency (the hf extra): only HF users reach this
    from transformers.modeling_outputs import CausalLMOutputWithPast  # optional dependency, as above

    class PlelabConfig(transformers.PretrainedConfig):
        """A plelab text model for transformers: ``plelab = {"model": ModelConfig, "ple": PLEConfig}`` as dicts."""

        model_type = MODEL_TYPE

        def __init__(self, plelab: dict | None = None, use_cache: bool = True, **kwargs) -> None:
            self.plelab = plelab or {"model": asdict(ModelConfig()), "ple": asdict(PLEConfig())}
            self.use_cache = use_cache
            mc, pc, _ = model_configs(self.plelab)
            for key, value in hf_config_fields(mc, pc).items():
                kwargs.setdefault(key, value)
            kwargs["tie_word_embeddings"] = mc.tie_word_embeddings
            super().__init__(**kwargs)

    class PlelabForCausalLM(transformers.PreTrainedModel, transformers.GenerationMixin):
        """plelab's PLE transformer under transformers' loading, saving and ``generate()`` (see the module doc)."""

        config_class = PlelabConfig
        base_model_prefix = "model"
        _no_split_modules = ["DecoderLayer"]
        main_input_name = "input_ids"

        def __init__(self, config: PlelabConfig) -> None:
            super().__init__(config)
            self.mc, self.pc, ac = model_configs(config.plelab)
            if self.pc.ids != "token" or ac.ids != "token":
                raise ValueError("ple.ids / aux.ids = 'iid' keys the table by random draws, not token ids; such a "
                                 "null-control model has no meaning outside plelab")
            self.model = PLETextModel(self.mc, self.pc, ac=ac)
            if not self.mc.tie_word_embeddings:
                self.lm_head = nn.Linear(self.mc.hidden_size, self.mc.vocab_size, bias=False)
            self.post_init()

        def _init_weights(self, module: nn.Module) -> None:
            if isinstance(module, RMSNorm):
                with torch.no_grad():
                    module.weight.fill_(1.0)
            elif isinstance(module, (nn.Linear, nn.Embedding)):
                with torch.no_grad():
                    module.weight.normal_(0.0, self.mc.initializer_range)

        def get_input_embeddings(self) -> nn.Embedding:
            return self.model.embed_tokens

        def get_output_embeddings(self) -> nn.Module | None:
            return None if self.mc.tie_word_embeddings else self.lm_head

        def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                    past_key_values=None, labels: torch.Tensor | None = None, use_cache: bool | None = None,
                    logits_to_keep: int = 0, **kwargs) -> CausalLMOutputWithPast:
            """``input_ids [B,T]`` -> logits ``[B,T,V]`` (HF conventions: ``labels`` shifted inside, -100 ignored)."""
            if input_ids is None:
                raise ValueError("PlelabForCausalLM needs input_ids (the per-layer table is indexed by token id)")
            if attention_mask is not None and not bool(attention_mask.bool().all()):
                raise ValueError("PlelabForCausalLM does not support padding (attention_mask has zeros); generate "
                                 "one prompt at a time, or prompts of one length")
            use_cache = self.config.use_cache if use_cache is None else use_cache
            if use_cache and past_key_values is None and not self.training:
                past_key_values = transformers.DynamicCache(config=self.config)
            hidden = self.model(input_ids, past_key_values=past_key_values if use_cache else None)
            if logits_to_keep:
                hidden = hidden[:, -logits_to_keep:]
            weight = self.model.embed_tokens.weight if self.mc.tie_word_embeddings else self.lm_head.weight
            logits = F.linear(hidden, weight)
            loss = None
            if labels is not None:
                loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                       labels[:, 1:].reshape(-1), ignore_index=-100)
            return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=past_key_values if use_cache
                                          else None)

    return PlelabConfig, PlelabForCausalLM


def register() -> None:
    """Register ``PlelabConfig`` / ``PlelabForCausalLM`` with transformers' Auto classes (idempotent)."""
    import transformers  # optional dependency (the hf extra)

    config_class, model_class = classes()
    transformers.AutoConfig.register(MODEL_TYPE, config_class, exist_ok=True)
    transformers.AutoModelForCausalLM.register(config_class, model_class, exist_ok=True)
