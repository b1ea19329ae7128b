"""``plelab export RUN OUT``: a plelab text run as an HF folder transformers loads, with its tokenizer.

- A dP=0 run becomes a plain ``LlamaForCausalLM`` (the trunk is Llama's block: RMSNorm with plain weight, RoPE in
  the half-split layout, GQA, SwiGLU). Llama has no embedding scale, so it is folded into the weights and the
  head is exported untied: ``model.embed_tokens = √H·E`` and ``lm_head = E`` (E: the run's tied embedding).
- A PLE run, or a run with another kind of the table family (``aux.kind``), becomes a ``PlelabForCausalLM`` folder
  (``model_type="plelab"``, :mod:`plelab.integrations.hf_model`): ``AutoModelForCausalLM.from_pretrained(OUT)``
  loads it once ``plelab`` is imported; no remote code.

Both folders hold ``tokenizer.json`` with the files ``AutoTokenizer`` reads (EOS ``<|endoftext|>``) and a
``generation_config.json``. The folder is written next to ``OUT`` and renamed into place only after transformers
loaded it back and its logits matched the run's within :data:`TOLERANCE` (``verify``); a write that fails (a full
disk) is one line, and the half-written folder is removed.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from plelab.config.schema import RunConfig
from plelab.data.tokenizer import EOS, load_tokenizer
from plelab.errors import PlelabError
from plelab.integrations.hf import EXPORT_PLE_TRANSFORMERS, minor_version, refuse_attached
from plelab.integrations.hf_model import MODEL_TYPE, classes, register, require_transformers
from plelab.integrations.pretrained import from_pretrained
from plelab.io import check_folder_target, ensure_dir, replace_synced, save_safetensors, temp_dir, write_failure
from plelab.training.checkpoint import read_state
from plelab.training.loading import checkpoint_of, load_for_eval, run_tokenizer_file
from plelab.training.task import task_kind

TOLERANCE = 1e-5


@dataclass
class ExportResult:
    out: Path
    architecture: str  # LlamaForCausalLM | PlelabForCausalLM
    step: int
    max_logit_diff: float | None  # transformers' logits vs plelab's on a check batch (None: not verified)
    notes: list[str]


def _llama(cfg: RunConfig, state: dict[str, torch.Tensor]):
    """The LlamaConfig and Llama-named weights of a dP=0 run (embedding scale folded in, head untied)."""
    import transformers  # optional dependency (the hf extra): export writes transformers folders

    mc = cfg.model
    config = transformers.LlamaConfig(
        vocab_size=mc.vocab_size, hidden_size=mc.hidden_size, intermediate_size=mc.intermediate_size,
        num_hidden_layers=mc.num_hidden_layers, num_attention_heads=mc.num_attention_heads,
        num_key_value_heads=mc.num_key_value_heads, head_dim=mc.resolved_head_dim, hidden_act="silu",
        max_position_embeddings=max(2048, cfg.train.seq_len), rms_norm_eps=mc.rms_norm_eps,
        rope_theta=mc.rope_theta, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        initializer_range=mc.initializer_range, bos_token_id=0, eos_token_id=0)
    config.architectures = ["LlamaForCausalLM"]
    weights = dict(state)
    embed = weights["model.embed_tokens.weight"]
    if mc.tie_word_embeddings:
        weights["lm_head.weight"] = embed.clone()
    if mc.scale_embeddings:
        weights["model.embed_tokens.weight"] = embed * math.sqrt(mc.hidden_size)
    scale = f"√H·E (√{mc.hidden_size})" if mc.scale_embeddings else "E"
    head = "E" if mc.tie_word_embeddings else "the run's lm_head"
    note = f"exported untied for Llama: model.embed_tokens = {scale}, lm_head = {head}"
    return config, weights, note


def _tokenizer_files(tokenizer: Path, folder: Path, seq_len: int) -> None:
    import transformers  # optional dependency (the hf extra)

    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer), eos_token=EOS, bos_token=EOS,
                                               unk_token=None, model_max_length=seq_len)
    tok.save_pretrained(folder)


def _check_logits(model: torch.nn.Module, folder: Path, vocab: int, seq_len: int) -> float:
    loaded = from_pretrained("AutoModelForCausalLM", folder, "the folder export just wrote",
                             dtype=torch.float32).eval()
    ids = torch.randint(0, vocab, (2, min(seq_len, 32)), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = loaded(input_ids=ids, use_cache=False).logits.float()
        ours = model(ids).logits.float()
    return float((theirs - ours).abs().max())


def export(run: str | Path, out: str | Path, verify: bool = True) -> ExportResult:
    """Write the run's latest checkpoint (or the checkpoint folder given) as an HF model folder ``out``.

    Refuses an existing ``out``, a visual run and a null-control run (``ple.ids=iid``); with ``verify`` the
    folder is loaded back through ``AutoModelForCausalLM`` and must give the run's logits within 1e-5.
    """
    transformers = require_transformers("plelab export")
    refuse_attached(run, "plelab export")
    out = Path(out)
    if out.exists():
        raise PlelabError(f"{out} exists; export writes a new folder — choose another OUT or delete it")
    check_folder_target(out, "export folder", "choose another OUT")
    ckpt = checkpoint_of(run)
    cfg = RunConfig.from_dict(read_state(ckpt, for_resume=False)["config"])
    if not task_kind(cfg).exportable:
        raise PlelabError(f"{ckpt} is a {cfg.kind} run: export writes text models (its model has no HF class)")
    if (cfg.ple.enabled and cfg.ple.ids != "token") or (cfg.aux.extra and cfg.aux.ids != "token"):
        key = "aux.ids" if cfg.aux.extra else "ple.ids"
        raise PlelabError(f"{ckpt} is a null-control run ({key}=iid): its table rows are keyed by random draws, so "
                          f"the model means nothing outside plelab; export a run with {key}=token")
    if cfg.ple.enabled:
        import transformers  # optional dependency (the hf extra)

        if minor_version(transformers.__version__) < EXPORT_PLE_TRANSFORMERS:
            need = ".".join(map(str, EXPORT_PLE_TRANSFORMERS))
            raise PlelabError(f"exporting a PLE run needs transformers >= {need} (this is {transformers.__version__}, "
                              "whose loader reads the exported model back wrong): pip install "
                              f"'transformers>={need},<6'")
    tokenizer = run_tokenizer_file(ckpt)
    load_tokenizer(tokenizer)  # a damaged tokenizer.json is one line here, before anything is written
    model, _ = load_for_eval(ckpt, mmap_table=False)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    step = int(read_state(ckpt, for_resume=False)["step"])
    if cfg.ple.enabled or cfg.aux.extra:
        register()
        config_class, _ = classes()
        config = config_class(plelab={"model": asdict(cfg.model), "ple": asdict(cfg.ple), "aux": asdict(cfg.aux)},
                              bos_token_id=0, eos_token_id=0)
        config.architectures = ["PlelabForCausalLM"]
        weights, notes = state, [f"model_type {MODEL_TYPE!r}: load with AutoModelForCausalLM after `import plelab`"]
    else:
        config, weights, note = _llama(cfg, state)
        notes = [note]
    ensure_dir(out.parent, "export folder's parent", "choose another OUT")
    tmp = None
    try:
        tmp = temp_dir(out.parent, prefix=f".{out.name}.", suffix=".tmp")
        config.save_pretrained(tmp)
        save_safetensors(weights, tmp / "model.safetensors", metadata={"format": "pt"})
        transformers.GenerationConfig(bos_token_id=0, eos_token_id=0).save_pretrained(tmp)
        _tokenizer_files(tokenizer, tmp, cfg.train.seq_len)
        diff = _check_logits(model, tmp, cfg.model.vocab_size, cfg.train.seq_len) if verify else None
        if diff is not None and not diff <= TOLERANCE:
            raise PlelabError(f"the exported model's logits differ from the run's by {diff:.2e} (> {TOLERANCE:g}); "
                              "this is a plelab bug — please report it with the run's config.json")
        replace_synced(tmp, out)
    except Exception as err:  # a full disk, a quota: one line, and nothing left (a bug is raised as it is)
        why = write_failure(err)
        if why is None:
            raise
        raise PlelabError(f"cannot write export folder {out}: {why}; free space or choose another OUT, then export "
                          "again (nothing was left behind)") from None
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return ExportResult(out=out, architecture=config.architectures[0], step=step, max_logit_diff=diff, notes=notes)
