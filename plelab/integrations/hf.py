"""Gemma-style PLE added to an HF decoder-only causal LM: :func:`attach`, and the round trip through disk.

What :func:`attach` does to ``model`` (a ``LlamaForCausalLM``, ``Qwen3ForCausalLM``, ... built by transformers):

- registers Gemma's PLE tensors next to the host's, under Gemma's names: ``embed_tokens_per_layer``,
  ``per_layer_model_projection`` and ``per_layer_projection_norm`` on the base model (``model.model``),
  ``per_layer_input_gate``, ``per_layer_projection`` and ``post_per_layer_input_norm`` on each decoder layer —
  so ``state_dict`` and ``save_pretrained`` carry ``model.embed_tokens_per_layer.weight``,
  ``model.layers.{l}.per_layer_projection.weight``, ... (``docs/ple.md`` §1.1);
- hooks the forward: the base model's input ids and the input-embedding module's output ``e [B,T,H]`` give the
  per-layer inputs ``P = PerLayerEmbedding(e, ids) [B,T,L,dP]`` (§1.2), and each decoder layer's output gets
  ``h ← h + PerLayerInjection(h, P[:, :, l])`` — the Gemma 4 plain form, after the MLP's residual add (§1.3).

``P`` lives in a frame opened by the base model's forward and closed when that forward returns or raises: nothing
outlives the call, and one process per replica (DDP, FSDP) keeps its own frames. The host's embedding scale (Gemma
multiplies by √H, Llama does not) reaches ``c`` only through the RMSNorm's ``eps``: the projection is normalised.

A folder ``save_pretrained`` writes after attach says ``"model_type": "plelab_attached"`` (:func:`mark_attached`): plain
``AutoModelForCausalLM.from_pretrained`` loads it with PLE once plelab is imported, and refuses it otherwise
(:mod:`plelab.integrations.hf_attached`); :func:`load_attached` reads both that and the older host-typed folders.

Init: ``"gemma"`` is HF's (normal(0, ``initializer_range``), norm weights 1). ``"function-preserving"`` is the same
with the branch's last factor at zero, so the logits equal the host's at step 0 — :class:`PerLayerInjection`'s own
``init`` option, which says which factor and when each PLE tensor first gets a gradient.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import torch
from torch import nn

from plelab.config.schema import GATE_KINDS
from plelab.diagnostics.monitor import ATTACH_CONFIG_KEY as PLE_CONFIG_KEY
from plelab.diagnostics.monitor import TABLE_CONFIG_KEY
from plelab.errors import PlelabError
from plelab.integrations.pretrained import from_pretrained, loader_errors, loader_reason
from plelab.io import atomic_write
from plelab.model.hf_weights import load_hf_weights, read_safetensors
from plelab.model.ple import INITS, PerLayerEmbedding, PerLayerInjection, PLEModules, keep_unregistered, token_table_ids

# Families transformers builds offline from a config whose layout attach knows (model_type -> how it is reached).
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "gpt_neox")
# attach's supported transformers: [lowest, first refused) as (major, minor). .ci/run tests both ends the package index
# serves (5.0 and the newest 5.x) beside the pinned release; 6 is a major release attach has not met.
ATTACH_TRANSFORMERS = ((5, 0), (6, 0))
TESTED_TRANSFORMERS = ("5.0", "5.23", "5.25")  # major.minor versions the test suite ran attach under
# the lowest release whose loader reads plelab's own PLE model (PlelabForCausalLM) back exactly: under 5.0–5.12 an
# exported run's logits differ from the run's (measured: 5.0.0, 5.10.4, 5.11.0, 5.12.1; 5.13.1 and later equal)
EXPORT_PLE_TRANSFORMERS = (5, 13)
ATTACHED_TYPE = "plelab_attached"  # the model_type a folder saved after attach carries (the host's in plelab_ple)
# plelab.attach_table's (plelab.integrations.hf_aux): its config entry and the base model's attribute holding its hooks
TABLE_ATTACHMENT = "plelab_table_attachment"
# loaders of other attached folders, by their config entry (hf_aux registers attach_table's when it is imported)
FOLDER_LOADERS: dict = {}


def mark_attached(folder: str | Path, key: str = PLE_CONFIG_KEY) -> None:
    """Rewrite ``folder/config.json`` (written by ``save_pretrained`` of an attached model) so that its model_type is
    :data:`ATTACHED_TYPE`; the host's type is in its ``key`` entry (``plelab_ple``; ``plelab_table`` after
    ``attach_table``). A folder without config.json (a rank that does not save) is left alone."""
    path = Path(folder) / "config.json"
    if not path.exists():
        return
    config = json.loads(path.read_text())
    saved = config.get(key)
    if not isinstance(saved, dict) or config.get("model_type") == ATTACHED_TYPE:
        return
    saved.setdefault("host_model_type", config.get("model_type"))
    config["model_type"] = ATTACHED_TYPE
    atomic_write(path, lambda p: p.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n"))


def refuse_attached(path: str | Path, verb: str) -> None:
    """Refuse, in one line naming the loader, a folder ``save_pretrained`` wrote after :func:`attach` where ``verb``
    (a plelab verb taking plelab runs) was given one."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return
    attached = isinstance(config, dict) and any(isinstance(config.get(k), dict) for k in (PLE_CONFIG_KEY,
                                                                                          TABLE_CONFIG_KEY))
    if attached and not (Path(path) / "state.json").exists():
        raise PlelabError(f"{path} is an HF model folder saved after plelab.attach, not a plelab run: {verb} takes "
                          "plelab runs — load it with plelab.load_attached(path) (or "
                          "transformers.AutoModelForCausalLM.from_pretrained(path) after import plelab) and use "
                          "transformers' generate; plelab diagnose reads it as it is")


def saves_attached(model: nn.Module, key: str = PLE_CONFIG_KEY) -> None:
    """Make ``model.save_pretrained`` mark the folder it writes (:func:`mark_attached` of its ``key`` entry)."""
    save = model.save_pretrained

    def save_pretrained(save_directory, *args, **kwargs):
        out = save(save_directory, *args, **kwargs)
        mark_attached(save_directory, key)
        return out

    save_pretrained.__doc__ = (f"{save.__doc__ or ''}\n\nplelab.attach: the folder's config.json says model_type "
                               f"{ATTACHED_TYPE!r} (load it with plelab.load_attached, or AutoModelForCausalLM after "
                               "import plelab).")
    object.__setattr__(model, "save_pretrained", save_pretrained)


def minor_version(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string such as ``"5.23.0"`` or ``"5.25.0.dev0"`` ((0, 0) if unreadable)."""
    parts = version.split(".") + ["0"]
    digits = "".join(ch for ch in parts[1] if ch.isdigit()) or "0"
    return (int(parts[0]), int(digits)) if parts[0].isdigit() else (0, 0)


def check_transformers(version: str, allow_untested: bool = False) -> None:
    """Refuse a transformers version outside attach's supported range :data:`ATTACH_TRANSFORMERS` (``allow_untested``
    lets it run anyway)."""
    low, high = ATTACH_TRANSFORMERS
    if allow_untested or low <= minor_version(version) < high:
        return
    raise PlelabError(f"plelab.attach supports transformers {low[0]}.{low[1]} up to (not including) {high[0]}.{high[1]} "
                      f"(tested with {', '.join(TESTED_TRANSFORMERS)}), this is {version}: install one (pip install "
                      f"'transformers>={low[0]}.{low[1]},<{high[0]}'), or pass allow_untested_transformers=True to try "
                      "anyway")


def _host_parts(model: nn.Module) -> tuple[nn.Module, nn.Module, nn.ModuleList, object]:
    """``(base model, input-embedding module, decoder layers, text config)`` of a supported HF causal LM."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "get_input_embeddings") or not hasattr(model, "base_model"):
        raise PlelabError(f"plelab.attach takes an HF transformers causal LM (a PreTrainedModel), not "
                          f"{type(model).__name__}; for plelab's own model set ple.dim in its config instead")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    kind = getattr(text, "model_type", None)
    if kind not in SUPPORTED_MODEL_TYPES:
        already = " (it has per-layer embeddings already)" if getattr(text, "hidden_size_per_layer_input", 0) else ""
        raise PlelabError(f"plelab.attach does not support model_type {kind!r}{already}; supported: "
                          f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    base = model.base_model
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) != text.num_hidden_layers:
        raise PlelabError(f"{type(model).__name__}: its base model has no list of {text.num_hidden_layers} decoder "
                          "layers where attach expects it (base_model.layers); this transformers version lays the "
                          "model out differently")
    return base, model.get_input_embeddings(), layers, text


class _Frames(threading.local):
    """The per-call hand-off of ``P``: one frame per base-model forward in flight on this thread."""

    def __init__(self) -> None:
        self.stack: list[dict] = []


class Attachment:
    """The forward hooks that run attached PLE; kept on the base model as ``plelab_attachment`` (unregistered).

    ``remove()`` takes the hooks off (the tensors stay registered).
    """

    def __init__(self, base: nn.Module, embed: nn.Module, layers: nn.ModuleList, embedding: PerLayerEmbedding,
                 injections: list[PerLayerInjection]) -> None:
        self.base, self.layers, self.embedding, self.injections = base, layers, embedding, injections
        self.frames = _Frames()
        self.handles = [base.register_forward_pre_hook(self._open, with_kwargs=True),
                        base.register_forward_hook(self._close, always_call=True),
                        embed.register_forward_hook(self._embedded)]
        self.handles += [layer.register_forward_hook(self._layer_hook(i)) for i, layer in enumerate(layers)]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _open(self, base, args, kwargs):
        frame: dict = {"ids": None, "P": None}
        self.frames.stack.append(frame)  # first: the always-called close pops it, also when a check below raises
        ids = kwargs.get("input_ids", args[0] if args else None)
        table_ids = kwargs.pop("table_ids", None)
        embeds = kwargs.get("inputs_embeds")
        if base.training and any(getattr(layer, "gradient_checkpointing", False) for layer in self.layers):
            raise PlelabError("attached PLE does not run under gradient checkpointing (the recomputed layers would "
                              "miss their per-layer inputs, and their gradients would be wrong): call "
                              "model.gradient_checkpointing_disable(); for the memory, train a smaller per-device "
                              "batch with gradient accumulation (Trainer: gradient_accumulation_steps), or plelab's "
                              "own decoder with train.activation_checkpointing=true, whose checkpointed layers "
                              "recompute their per-layer inputs")
        if table_ids is None:
            if ids is None:
                raise PlelabError("attached PLE needs input_ids (the per-layer table is indexed by token id): pass "
                                  "input_ids, or inputs_embeds together with table_ids=[B,T] row ids")
            table_ids = token_table_ids(ids, self.embedding.owner.embed_tokens_per_layer.num_embeddings)
        frame["ids"] = table_ids
        if embeds is not None:
            frame["P"] = self.embedding(embeds, table_ids)
        return args, kwargs

    def _close(self, base, args, out) -> None:
        if self.frames.stack:
            self.frames.stack.pop()

    def _embedded(self, embed, args, e) -> None:
        if self.frames.stack and self.frames.stack[-1]["P"] is None:
            frame = self.frames.stack[-1]
            frame["P"] = self.embedding(e, frame["ids"])

    def _layer_hook(self, index: int):
        injection = self.injections[index]

        def hook(layer, args, out):
            if not self.frames.stack or self.frames.stack[-1]["P"] is None:
                return out
            p = self.frames.stack[-1]["P"][:, :, index]
            if isinstance(out, tuple):
                return (out[0] + injection(out[0], p), *out[1:])
            return out + injection(out, p)
        return hook


def attach(model: nn.Module, dim: int, *, gate: str = "gemma", vocab_size: int | None = None,
           init: str = "function-preserving", freeze_host: bool = False, sparse_table: bool = False,
           table_device: str | torch.device | None = None, seed: int = 0,
           allow_untested_transformers: bool = False) -> nn.Module:
    """Add Gemma-style per-layer embeddings to an HF decoder-only causal LM, in place; returns ``model``.

    ``dim``: dP, 1 ≤ dP ≤ hidden size. ``vocab_size``: table rows Vp (default: the host's vocabulary; ids ≥ Vp
    read row 0). ``gate``: ``gemma`` | ``scalar`` | ``vector`` | ``none``. ``init``: ``function-preserving``
    (logits unchanged at step 0) or ``gemma`` (HF's init). ``freeze_host``: only the PLE tensors train.
    ``sparse_table``: row-sparse table gradients (pair with :func:`plelab.param_groups` and :func:`plelab.adamw`).
    ``table_device``: keep the table there (``"cpu"`` under a GPU trunk: only looked-up rows travel).
    ``seed``: the PLE tensors' init (the host's weights are not touched).
    """
    import transformers  # optional dependency (the hf extra): only attaching to an HF model needs it

    check_transformers(transformers.__version__, allow_untested_transformers)
    base, embed, layers, text = _host_parts(model)
    if isinstance(getattr(base, "plelab_attachment", None), Attachment):
        raise PlelabError(f"{type(model).__name__} has PLE attached already (dP={base.per_layer_embedding.dim})")
    if getattr(base, TABLE_ATTACHMENT, None) is not None:  # plelab.attach_table's
        raise PlelabError(f"{type(model).__name__} has a plelab table attached already (plelab.attach_table): one "
                          "table per model; attach PLE to a fresh copy of the host instead")
    hidden, vocab = text.hidden_size, embed.num_embeddings
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= hidden:
        raise PlelabError(f"PLE dim must be an integer from 1 to the hidden size {hidden}, got {dim!r}")
    vp = vocab if vocab_size is None else vocab_size
    if isinstance(vp, bool) or not isinstance(vp, int) or not 1 <= vp <= vocab:
        raise PlelabError(f"PLE vocab_size must be an integer from 1 to the host's vocabulary {vocab}, got {vp!r}")
    if gate not in GATE_KINDS:
        raise PlelabError(f"unknown PLE gate {gate!r}: choose one of {', '.join(GATE_KINDS)}")
    if init not in INITS:
        raise PlelabError(f"unknown PLE init {init!r}: choose one of {', '.join(INITS)}")
    if freeze_host:
        model.requires_grad_(False)
    eps = float(getattr(text, "rms_norm_eps", getattr(text, "layer_norm_eps", 1e-6)))
    weight = embed.weight
    with torch.random.fork_rng(devices=[]):  # the modules' default init draws from the global RNG: keep the user's
        embedding = PerLayerEmbedding(vp, hidden, len(layers), dim, eps=eps, sparse=sparse_table, register_on=base)
        injections = [PerLayerInjection(hidden, dim, gate, eps=eps, init=init, register_on=layer) for layer in layers]
    keep_unregistered(base, "per_layer_embedding", embedding)
    for layer, injection in zip(layers, injections):
        keep_unregistered(layer, "per_layer_injection", injection)
    ple = PLEModules(model)
    generator = torch.Generator().manual_seed(seed)
    std = float(getattr(text, "initializer_range", 0.02))
    embedding.reset_parameters(std, generator=generator)
    for injection in injections:
        injection.reset_parameters(std, generator=generator)  # applies init (function-preserving: last factor 0)
    for p in ple.parameters():
        p.data = p.data.to(device=weight.device, dtype=weight.dtype)
        p.requires_grad_(True)
    if table_device is not None:
        ple.table.data = ple.table.data.to(table_device)
    model.config.update({PLE_CONFIG_KEY: {"dim": dim, "gate": gate, "vocab_size": vp, "init": init,
                                          "sparse_table": sparse_table, "seed": seed, "init_std": std,
                                          "host_model_type": model.config.model_type}})
    saves_attached(model)
    keep_unregistered(base, "plelab_attachment", Attachment(base, embed, layers, embedding, injections))
    return model


def load_attached(path: str | Path, **from_pretrained_kwargs) -> nn.Module:
    """Load a folder written by ``save_pretrained`` from a model with PLE attached: the host through
    ``AutoModelForCausalLM.from_pretrained`` (safetensors only, every tensor checked:
    :func:`~plelab.integrations.pretrained.from_pretrained`), then :func:`attach` with the saved arguments, then the
    PLE tensors from the folder's safetensors (every one of them must be there, dtype and shape checked)."""
    path = Path(path)
    config_file, config = folder_config(path)
    for key, loader in FOLDER_LOADERS.items():
        if isinstance(config, dict) and isinstance(config.get(key), dict):
            return loader(path, **from_pretrained_kwargs)
    saved = config.get(PLE_CONFIG_KEY) if isinstance(config, dict) else None
    if not saved or not isinstance(saved, dict):
        table = " (it has a plelab.attach_table entry: import plelab, or call plelab.load_attached_table)" if (
            isinstance(config, dict) and TABLE_CONFIG_KEY in config) else ""
        raise PlelabError(f"{path}: its config.json has no {PLE_CONFIG_KEY!r} entry — it was not saved from a model "
                          f"with plelab.attach; load it with transformers directly{table}")
    model = load_host(path, config, saved, PLE_CONFIG_KEY, "plelab.attach", from_pretrained_kwargs)
    missing = [k for k in ("dim", "gate", "vocab_size") if k not in saved]
    if missing:
        raise PlelabError(f"{config_file}: its {PLE_CONFIG_KEY!r} entry lacks {', '.join(missing)}; save the attached "
                          "model again with save_pretrained")
    attach(model, saved["dim"], gate=saved["gate"], vocab_size=saved["vocab_size"], init=saved.get("init", "gemma"),
           sparse_table=saved.get("sparse_table", False), seed=saved.get("seed", 0), allow_untested_transformers=True)
    return load_own_tensors(model, path, PLEModules(model).parameters(), "PLE")


def folder_config(path: Path) -> tuple[Path, object]:
    """``(path/config.json, its parsed JSON)``; an unreadable one is a one-line error."""
    config_file = path / "config.json"
    try:
        return config_file, json.loads(config_file.read_text())
    except (OSError, ValueError) as err:
        raise PlelabError(f"{config_file}: cannot read an HF config ({err}); give the folder save_pretrained wrote"
                          ) from None


def load_host(path: Path, config: dict, saved: dict, key: str, by: str, kwargs: dict) -> nn.Module:
    """The host model of a folder saved after ``by`` (``plelab.attach`` / ``plelab.attach_table``), whose config
    entry ``key`` is ``saved``: a folder marked ``plelab_attached`` gets its host's config rebuilt from its keys."""
    config_file = path / "config.json"
    if config.get("model_type") == ATTACHED_TYPE:  # the host's config, rebuilt from the same keys
        host = saved.get("host_model_type")
        if not isinstance(host, str):
            raise PlelabError(f"{config_file} says model_type {ATTACHED_TYPE!r} but its {key!r} entry names no "
                              "host_model_type; save the attached model again with save_pretrained")
        import transformers  # optional dependency (the hf extra): a saved HF folder needs it to load

        try:
            host_config = transformers.AutoConfig.for_model(host, **{k: v for k, v in config.items()
                                                                     if k != "model_type"})
        except loader_errors() as err:  # a field of the wrong type (hidden_size 2.0) is a StrictDataclassError
            raise PlelabError(f"{config_file}: transformers cannot rebuild its host config of type {host!r} "
                              f"({loader_reason(err)}); save the attached model again with save_pretrained") from None
        kwargs.setdefault("config", host_config)
    # the attached tensors are "unexpected" to the host class (quiet: from_pretrained's logging is off): loaded after
    return from_pretrained("AutoModelForCausalLM", path, f"the host model of a folder saved after {by}", **kwargs)


def load_own_tensors(model: nn.Module, path: Path, params, what: str) -> nn.Module:
    """Load the attached tensors ``params`` of ``model`` from ``path``'s safetensors files (every one of them must be
    there; dtype and shape checked)."""
    own = {id(p) for p in params}
    wanted = {n for n, p in model.named_parameters() if id(p) in own}
    found = read_safetensors(path, keys=wanted)
    if wanted - found.keys():
        raise PlelabError(f"{path}: the {what} tensors {sorted(wanted - found.keys())[:3]} are missing from its "
                          "safetensors files; save the attached model again with save_pretrained")
    load_hf_weights(model, found)
    return model

