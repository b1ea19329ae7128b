"""Loading a trained model for evaluation or inference, with the per-layer table memory-mapped.

The table is most of a PLE model's bytes (Gemma 3n E2B: 262,144 × 30·256 entries) and a step reads
only the rows of its tokens. :func:`load_for_eval` maps ``embed_tokens_per_layer.weight`` straight
from ``model.safetensors`` (copy-on-write ``mmap``: the page cache holds what was read, nothing is
copied up front, nothing is allocated on the accelerator) and loads the rest of the model onto
``device``; :meth:`plelab.model.transformer.PLETextModel.per_layer_token_embeddings` then gathers
each batch's rows on the host and copies them over.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from plelab.config.schema import RunConfig
from plelab.errors import PlelabError
from plelab.model.init import materialise
from plelab.model.loading import check_tensors, header_specs, mmap_tensor
from plelab.model.ple import TABLE_KEY
from plelab.model.transformer import PLECausalLM
from plelab.training.checkpoint import list_checkpoints, model_file, read_state
from plelab.training.task import task_kind


def checkpoint_of(path: str | Path) -> Path:
    """The checkpoint folder for a run folder (its latest) or a checkpoint folder."""
    path = Path(path)
    if not path.exists():
        raise PlelabError(f"{path} does not exist; give a run folder written by plelab train or one of its "
                          "checkpoints/step-N folders")
    if (path / "model.safetensors").exists():
        return path
    model_file(path)  # a sharded checkpoint not consolidated yet: one line saying how
    found = list_checkpoints(path)
    if not found:
        raise PlelabError(f"{path} holds no plelab checkpoint; give a run folder written by plelab train "
                          "or one of its checkpoints/step-N folders")
    model_file(found[-1])
    return found[-1]


def run_tokenizer_file(ckpt: Path) -> Path:
    """The ``tokenizer.json`` of the run a checkpoint folder belongs to (every text run folder holds one)."""
    run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt
    for folder in (ckpt, run_dir):
        if (folder / "tokenizer.json").exists():
            return folder / "tokenizer.json"
    raise PlelabError(f"{run_dir} has no tokenizer.json (runs written before plelab saved it there): copy the run's "
                      "tokenizer.json (from the cache, or the one --tokenizer named) into the run folder")


def load_for_eval(path: str | Path, device: str | torch.device = "cpu",
                  mmap_table: bool = True) -> tuple[PLECausalLM, RunConfig]:
    """A trained text model in eval mode, ``(model, config)``, from a run or checkpoint folder.

    With ``mmap_table`` the table stays a read-only map of the file on the host (whatever ``device``);
    otherwise it is read into memory on ``device`` like every other tensor.
    """
    ckpt = checkpoint_of(path)
    cfg = RunConfig.from_dict(read_state(ckpt, for_resume=False)["config"])
    if not task_kind(cfg).text_model:
        raise PlelabError(f"{ckpt} is a {cfg.kind} run; load_for_eval reads text models")
    if cfg.model.host != "plelab":
        raise PlelabError(f"{ckpt} was trained on a model.{'hf_config' if cfg.model.host == 'hf' else 'factory'} "
                          "trunk: eval, export and generate read plelab's own decoder — load it with "
                          "plelab.load_host_run(path) (plelab diagnose reads it as it is)")
    with torch.device("meta"):
        model = PLECausalLM(cfg.model, cfg.ple, ac=cfg.aux)
    tm = model.model
    file = model_file(ckpt)
    mapped = mmap_table and cfg.ple.enabled
    materialise(model, device, None if mapped else device)
    table = tm.embed_tokens_per_layer if mapped else None
    # every tensor's name, dtype and shape from the header, before anything is read (a relabelled dtype would load)
    check_tensors(str(file), header_specs(file), model.state_dict(keep_vars=True),
                  "the file was altered or belongs to another run: use the run's own checkpoint")
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f, torch.no_grad():
            for name, p in model.state_dict(keep_vars=True).items():
                if not (mapped and name == TABLE_KEY):
                    p.copy_(f.get_tensor(name))
    except (SafetensorError, OSError) as err:
        why = (str(err).splitlines() or [repr(err)])[0]
        raise PlelabError(f"{file} is not a readable safetensors file ({why})") from None
    if table is not None:
        table.weight = torch.nn.Parameter(mmap_tensor(file, TABLE_KEY), requires_grad=False)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval(), cfg
