"""The table family's other kinds on an HF decoder: :func:`attach_table`, and the round trip through disk.

What :func:`attach_table` adds to ``model`` (a causal LM of :data:`~plelab.integrations.hf.SUPPORTED_MODEL_TYPES`),
in place, under the names plelab's own decoder uses (:mod:`plelab.model.transformer`), so state dicts match:

    value       model.value_embeddings  (ValueEmbeddings): a forward hook on each selected layer's self_attn.v_proj
                adds g ⊙ VE_l[ids], g = 3·sigmoid(W_g,l x[..., :c]), x = v_proj's input (the normed hidden state),
                flattened to v_proj's output [B,T,n_kv·hd] — before the cache and attention see v
    ngram       model.ngram_embedding   (HashedNgramEmbedding): y = W_proj concat_s E[hash_s(ids)] once per
                base-model forward; a forward pre-hook on each decoder layer adds λ_l·y to its hidden_states
    modulation  model.token_modulation  (TokenModulation): a forward hook on each selected layer's mlp scales its
                output by (1 + M[ids]_l)

Per-call state (ids, y, M) lives in a frame opened by a pre-hook on the base model and closed by an always-called
hook: nothing outlives the forward. With a KV cache the n-gram hash reaches back into the cached positions through
``ngram_tokens`` (the last n-1 tokens) kept on the cache object, as plelab's decoder does, so cached decoding equals
full recomputation; beam search's reorderings of the cache reorder them too, and a cache cut shorter than this
model left it (assisted decoding's crop) is refused rather than hashed wrongly.

``save_pretrained`` then writes ``"model_type": "plelab_attached"`` with the table's arguments in ``plelab_table``:
:func:`load_attached_table` reads it back (so do :func:`plelab.load_attached` and, with plelab imported,
``AutoModelForCausalLM.from_pretrained``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from plelab.errors import PlelabError
from plelab.integrations import hf
from plelab.model.init import NATIVE
from plelab.model.modulation import TokenModulation
from plelab.model.ngram import HashedNgramEmbedding, ngram_rows
from plelab.model.ple import keep_unregistered
from plelab.model.transformer import AUX_ATTRIBUTES, AUX_CLASSES
from plelab.model.value_embed import ValueEmbeddings, value_embed_layers

KINDS = ("value", "ngram", "modulation")
TABLE_CONFIG_KEY, ATTACHMENT = hf.TABLE_CONFIG_KEY, hf.TABLE_ATTACHMENT  # the config entry; the hooks' holder
MODULES, ATTRIBUTES = AUX_CLASSES, AUX_ATTRIBUTES  # the same classes and names as plelab's own decoder
SIZES = {"value": ("layers", "gate_channels"), "ngram": ("orders", "heads", "rows", "dim", "hash_seed"),
         "modulation": ("layers",)}


def _int(value, what: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f"from {low} to {high}" if high is not None else f">= {low}"
        raise PlelabError(f"attach_table: {what} must be an integer {span}, got {value!r}")
    return value


def _ints(value, what: str, low: int, high: int | None = None) -> list[int]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise PlelabError(f"attach_table: {what} must be a list of distinct integers, got {value!r}")
    items = [_int(v, f"each of {what}", low, high) for v in value]
    if not items or len(set(items)) != len(items):
        raise PlelabError(f"attach_table: {what} must be a non-empty list of distinct integers, got {list(value)!r}")
    return items


def _sizes(kind: str, sizes: dict, vocab: int, hidden: int, num_layers: int) -> dict:
    """The table's sizes, checked and with every default resolved (what the config records)."""
    extra = sorted(set(sizes) - set(SIZES[kind]))
    if extra:
        takes = ", ".join(SIZES[kind]) or "no sizes"
        raise PlelabError(f"attach_table({kind!r}) takes {takes}, not {', '.join(extra)}: drop "
                          f"{'it' if len(extra) == 1 else 'them'} (or choose the kind that {extra[0]} sizes)")
    if kind == "value":
        layers = sizes.get("layers")
        chosen = (list(value_embed_layers(num_layers)) if layers is None
                  else sorted(_ints(layers, "value layers", 0, num_layers - 1)))
        return {"layers": chosen, "gate_channels": _int(sizes.get("gate_channels", min(12, hidden)),
                                                        "gate_channels", 1, hidden)}
    if kind == "ngram":
        orders = _ints(sizes.get("orders", (2, 3)), "n-gram orders", 2)
        heads = _int(sizes.get("heads", 1), "n-gram heads", 1)
        rows = sizes.get("rows")
        rows = ngram_rows(vocab) if rows is None else _int(rows, "n-gram rows", 2)
        if rows % vocab == 0:
            raise PlelabError(f"attach_table: n-gram rows={rows} is a multiple of the vocabulary ({vocab}: collision "
                              "spikes); choose another, or leave rows out for the smallest prime >= 5·V")
        dim = sizes.get("dim")
        dim = max(1, hidden // (len(orders) * heads)) if dim is None else _int(dim, "n-gram dim", 1)
        return {"orders": orders, "heads": heads, "rows": rows, "dim": dim,
                "hash_seed": _int(sizes.get("hash_seed", 0), "hash_seed", 0, 2 ** 63 - 1)}
    layers = sizes.get("layers")
    return {"layers": (list(range(num_layers)) if layers is None
                       else sorted(_ints(layers, "modulated layers", 0, num_layers - 1)))}


def _value_heads(text, layers: nn.ModuleList, chosen: list[int]) -> tuple[int, int]:
    """``(n_kv, head_dim)`` from the selected layers' v_proj; refuses a layout without a separate one."""
    projections = [getattr(getattr(layers[i], "self_attn", None), "v_proj", None) for i in chosen]
    if not all(isinstance(v, nn.Linear) for v in projections):
        raise PlelabError(f"attach_table('value') needs a separate value projection (self_attn.v_proj) in each "
                          f"layer; {text.model_type} has none (its q, k and v are one fused matmul): choose 'ngram' "
                          "or 'modulation', or plelab.attach (PLE)")
    n_kv = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    width = projections[0].out_features
    if width % n_kv or any(v.out_features != width for v in projections):
        raise PlelabError(f"attach_table('value'): v_proj's {width} outputs are not {n_kv} equal kv heads")
    return n_kv, width // n_kv


def _follow_batch(cache) -> None:
    """Make ``cache``'s batch reorderings (beam search, contrastive search) reorder its ``ngram_tokens`` too."""
    if getattr(cache, "_plelab_follows", False):
        return
    moves = {"reorder_cache": lambda t, i: t.index_select(0, i.to(t.device)),
             "batch_select_indices": lambda t, i: t[i.to(t.device)],
             "batch_repeat_interleave": lambda t, r: t.repeat_interleave(r, dim=0)}
    for name, move in moves.items():
        method = getattr(cache, name, None)
        if method is None:
            continue

        def follow(arg, method=method, move=move):
            out = method(arg)
            if getattr(cache, "ngram_tokens", None) is not None:
                cache.ngram_tokens = move(cache.ngram_tokens, arg)
            return out
        setattr(cache, name, follow)
    cache._plelab_follows = True


def _cache_of(kwargs: dict):
    """The KV cache a base model's forward was given: ``past_key_values``, or ``cache`` (its name from transformers
    5.2x on, where ``past_key_values`` is deprecated)."""
    cache = kwargs.get("past_key_values")
    return kwargs.get("cache") if cache is None else cache


class TableAttachment:
    """The forward hooks that run an attached table; kept on the base model as ``plelab_table_attachment``
    (unregistered). ``remove()`` takes the hooks off (the table stays registered)."""

    def __init__(self, base: nn.Module, layers: nn.ModuleList, kind: str, module: nn.Module) -> None:
        self.base, self.layers, self.kind, self.module = base, layers, kind, module
        self.frames = hf._Frames()
        self.handles = [base.register_forward_pre_hook(self._open, with_kwargs=True),
                        base.register_forward_hook(self._close, with_kwargs=True, always_call=True)]
        if kind == "value":
            self.handles += [layers[i].self_attn.v_proj.register_forward_hook(self._value(i)) for i in module.layers]
        elif kind == "ngram":
            self.handles += [layer.register_forward_pre_hook(self._ngram(i), with_kwargs=True)
                             for i, layer in enumerate(layers)]
        else:
            self.handles += [layers[i].mlp.register_forward_hook(self._modulation(i)) for i in module.layers]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _open(self, base, args, kwargs):
        frame: dict = {"ids": None, "term": None, "tail": None}  # term: y (ngram), M (modulation), rows (value)
        self.frames.stack.append(frame)  # first: the always-called close pops it, also when a check below raises
        if base.training and any(getattr(layer, "gradient_checkpointing", False) for layer in self.layers):
            raise PlelabError(f"an attached {self.kind} table does not run under gradient checkpointing (the layers "
                              "recomputed in backward would miss its term, and their gradients would be wrong): call "
                              "model.gradient_checkpointing_disable(); for the memory, train a smaller per-device "
                              "batch with gradient accumulation (Trainer: gradient_accumulation_steps)")
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            raise PlelabError(f"an attached {self.kind} table needs input_ids (it is indexed by token id): pass "
                              "input_ids rather than inputs_embeds (generate: input_ids, not inputs_embeds)")
        frame["ids"] = ids
        if self.kind == "ngram":
            frame["term"], frame["tail"] = self._ngram_term(ids, _cache_of(kwargs))
        elif self.kind == "modulation":
            frame["term"] = self.module(ids)
        else:
            frame["term"] = self.module.lookup(ids)  # every selected layer's rows, once per forward
        return None

    def _close(self, base, args, kwargs, out) -> None:
        frame = self.frames.stack.pop() if self.frames.stack else None
        if frame is None or frame["tail"] is None or out is None:  # out is None when the forward raised
            return
        cache = getattr(out, "past_key_values", None)  # the one passed in, or the one the base model made
        cache = getattr(out, "cache", None) if cache is None else cache
        cache = _cache_of(kwargs) if cache is None else cache
        if cache is not None:
            _follow_batch(cache)
            cache.ngram_tokens, cache.ngram_length = frame["tail"], cache.get_seq_length()

    def _ngram_term(self, ids: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """``(y [B,T,H], the last n-1 tokens seen)``; with a filled cache the n-grams reach back into its positions."""
        ngram, before = self.module, None
        if cache is not None and cache.get_seq_length() > 0:
            before = getattr(cache, "ngram_tokens", None)
            if (before is None or getattr(cache, "ngram_length", None) != cache.get_seq_length()
                    or before.shape[0] != ids.shape[0]):
                raise PlelabError("an attached n-gram table decoding with a KV cache needs the cache this model's "
                                  "own forward filled, as it left it (the last n-1 tokens are kept on it): pass the "
                                  "past_key_values it returned, not one filled elsewhere or cropped (assisted "
                                  "decoding), or decode without a cache (use_cache=False)")
        seen = ids if before is None else torch.cat([before.to(ids.device), ids], dim=1)
        tail = seen[:, seen.shape[1] - min(max(ngram.orders) - 1, seen.shape[1]):]
        return ngram(seen)[:, seen.shape[1] - ids.shape[1]:], tail

    def _term(self):
        return self.frames.stack[-1]["term"] if self.frames.stack else None

    def _value(self, index: int):
        def hook(v_proj, args, out):
            if not self.frames.stack:
                return out
            frame = self.frames.stack[-1]
            term = self.module(args[0], frame["ids"], index, frame["term"])  # [B,n_kv,T,hd]
            return out + term.transpose(1, 2).reshape(out.shape)
        return hook

    def _ngram(self, index: int):
        def hook(layer, args, kwargs):
            y = self._term()
            if y is None:
                return None
            term = self.module.layer_term(y, index)
            if args:
                return (args[0] + term, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + term}
        return hook

    def _modulation(self, index: int):
        def hook(mlp, args, out):
            m = self._term()
            return out if m is None else TokenModulation.modulate(out, self.module.at(m, index))
        return hook


def attach_table(model: nn.Module, kind: str, *, init: str = "function-preserving", seed: int = 0,
                 freeze_host: bool = False, allow_untested_transformers: bool = False, **sizes) -> nn.Module:
    """Add a token-indexed table of the family's kind ``kind`` (value | ngram | modulation) to an HF decoder-only
    causal LM, in place; returns ``model``. One table per model (PLE included).

    Sizes — value: ``layers`` (default nanochat's rule: every other layer, the last included), ``gate_channels``
    (12); ngram: ``orders`` ([2, 3]), ``heads`` (1), ``rows`` (the smallest prime >= 5·V), ``dim``
    (H // (len(orders)·heads)), ``hash_seed`` (0); modulation: ``layers`` (every layer). ``init``:
    ``function-preserving`` (the logits equal the host's at step 0) or ``native`` / the source's name (value:
    nanochat, ngram: modded, modulation: normal). ``seed``: the table's init (the host's weights are not touched).
    ``freeze_host``: only the table trains.
    """
    import transformers  # optional dependency (the hf extra)

    hf.check_transformers(transformers.__version__, allow_untested_transformers)
    if kind not in KINDS:
        raise PlelabError(f"unknown table kind {kind!r}: choose one of {', '.join(KINDS)} (PLE: plelab.attach)")
    try:
        base, embed, layers, text = hf._host_parts(model)
    except PlelabError as err:
        raise PlelabError(str(err).replace("plelab.attach ", "plelab.attach_table ")
                          .replace("set ple.dim", "set aux.kind")) from None
    if getattr(base, "plelab_attachment", None) is not None or getattr(base, ATTACHMENT, None) is not None:
        what = "PLE" if getattr(base, ATTACHMENT, None) is None else f"a {getattr(base, ATTACHMENT).kind} table"
        raise PlelabError(f"{type(model).__name__} has {what} attached already: one table per model (as plelab's "
                          "runs: aux.kind); attach to a fresh copy of the host instead")
    cls = MODULES[kind]
    if init not in ("function-preserving", "native", NATIVE[cls]):
        raise PlelabError(f"unknown {kind} table init {init!r}: choose function-preserving, native or {NATIVE[cls]}")
    init = NATIVE[cls] if init == "native" else init
    hidden, vocab, num_layers = text.hidden_size, embed.num_embeddings, len(layers)
    resolved = _sizes(kind, sizes, vocab, hidden, num_layers)
    if kind == "value":
        n_kv, head_dim = _value_heads(text, layers, resolved["layers"])
    if kind == "modulation" and not all(isinstance(getattr(layer, "mlp", None), nn.Module) for layer in layers):
        raise PlelabError(f"attach_table('modulation') needs an mlp module in each layer; {text.model_type} has none")
    weight = embed.weight
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):  # the modules' default init draws from the global RNG
        if kind == "value":
            module = ValueEmbeddings(vocab, num_layers, n_kv, head_dim, layers=resolved["layers"],
                                     gate_channels=resolved["gate_channels"])
        elif kind == "ngram":
            module = HashedNgramEmbedding(vocab, hidden, num_layers, orders=resolved["orders"],
                                          heads=resolved["heads"], rows=resolved["rows"], dim=resolved["dim"],
                                          seed=resolved["hash_seed"])
        else:
            module = TokenModulation(vocab, hidden, num_layers, layers=resolved["layers"])
    # nanochat's value tables use std H^-½ (its n_embd^-½), the others the host's initializer_range (as init_aux)
    std = hidden ** -0.5 if kind == "value" else float(getattr(text, "initializer_range", 0.02))
    module.reset_parameters(generator=torch.Generator().manual_seed(seed), std=std, init=init)
    module.to(device=weight.device, dtype=weight.dtype)
    if freeze_host:
        model.requires_grad_(False)
    setattr(base, ATTRIBUTES[kind], module)  # registered: model.value_embeddings.embed.weight, ...
    model.config.update({TABLE_CONFIG_KEY: {"kind": kind, "init": init, "seed": seed, "init_std": std,
                                            "sizes": resolved, "host_model_type": model.config.model_type}})
    hf.saves_attached(model, TABLE_CONFIG_KEY)
    keep_unregistered(base, ATTACHMENT, TableAttachment(base, layers, kind, module))
    return model


def load_attached_table(path: str | Path, **from_pretrained_kwargs) -> nn.Module:
    """Load a folder written by ``save_pretrained`` after :func:`attach_table`: the host through
    :func:`~plelab.integrations.pretrained.from_pretrained` (local safetensors only), then :func:`attach_table` with
    the saved arguments, then the table's tensors from the folder (every one must be there, shape and dtype checked)."""
    path = Path(path)
    config_file, config = hf.folder_config(path)
    saved = config.get(TABLE_CONFIG_KEY) if isinstance(config, dict) else None
    if not isinstance(saved, dict):
        raise PlelabError(f"{path}: its config.json has no {TABLE_CONFIG_KEY!r} entry — it was not saved from a model "
                          "with plelab.attach_table; load it with transformers directly (or plelab.load_attached)")
    if saved.get("kind") not in KINDS or not isinstance(saved.get("sizes"), dict):
        raise PlelabError(f"{config_file}: its {TABLE_CONFIG_KEY!r} entry names no kind ({', '.join(KINDS)}) and "
                          "sizes; save the attached model again with save_pretrained")
    model = hf.load_host(path, config, saved, TABLE_CONFIG_KEY, "plelab.attach_table", from_pretrained_kwargs)
    attach_table(model, saved["kind"], init=saved.get("init", "function-preserving"), seed=saved.get("seed", 0),
                 allow_untested_transformers=True, **saved["sizes"])
    return hf.load_own_tensors(model, path, getattr(model.base_model, ATTRIBUTES[saved["kind"]]).parameters(),
                               "table")


hf.FOLDER_LOADERS[TABLE_CONFIG_KEY] = load_attached_table  # plelab.load_attached reads these folders too
