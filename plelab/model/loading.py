"""Loading a trained model for evaluation or inference, with the per-layer table memory-mapped.

The table is most of a PLE model's bytes (Gemma 3n E2B: 262,144 × 30·256 entries) and a step reads
only the rows of its tokens. :func:`load_for_eval` maps ``embed_tokens_per_layer.weight`` straight
from ``model.safetensors`` (copy-on-write ``mmap``: the page cache holds what was read, nothing is
copied up front, nothing is allocated on the accelerator) and loads the rest of the model onto
``device``; :meth:`plelab.model.transformer.PLETextModel.per_layer_token_embeddings` then gathers
each batch's rows on the host and copies them over.
"""

from __future__ import annotations

import json
import mmap
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from plelab.config.schema import RunConfig
from plelab.errors import PlelabError
from plelab.model.init import materialise
from plelab.model.transformer import PLECausalLM

TABLE_KEY = "model.embed_tokens_per_layer.weight"
SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def tensor_location(file: str | Path, key: str) -> tuple[int, torch.dtype, list[int]]:
    """Where tensor ``key`` lies in a safetensors file: ``(byte offset of its data, dtype, shape)``, read from the
    header alone; one-line errors for a missing key, an unsupported dtype or a file cut short."""
    file = Path(file)
    with open(file, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        try:
            entry = json.loads(f.read(header_len))[key]
        except (ValueError, KeyError):
            raise PlelabError(f"{file} has no tensor {key} (or is not a safetensors file)") from None
    dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
    if dtype is None:
        raise PlelabError(f"{key} in {file} has dtype {entry['dtype']}; plelab reads {', '.join(SAFETENSORS_DTYPES)}")
    start, end = entry["data_offsets"]
    if 8 + header_len + end > file.stat().st_size:
        raise PlelabError(f"{file} is truncated ({key} ends past the end of the file); re-copy it")
    return 8 + header_len + start, dtype, entry["shape"]


def mmap_tensor(file: str | Path, key: str) -> torch.Tensor:
    """Tensor ``key`` of a safetensors file as a CPU tensor backed by a copy-on-write memory map."""
    offset, dtype, shape = tensor_location(file, key)
    with open(file, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    count = 1
    for n in shape:
        count *= n
    return torch.frombuffer(buf, dtype=dtype, count=count, offset=offset).view(shape)


def checkpoint_of(path: str | Path) -> Path:
    """The checkpoint folder for a run folder (its latest) or a checkpoint folder."""
    from plelab.training.checkpoint import list_checkpoints

    path = Path(path)
    if not path.exists():
        raise PlelabError(f"{path} does not exist; give a run folder written by plelab train or one of its "
                          "checkpoints/step-N folders")
    if (path / "model.safetensors").exists():
        return path
    found = list_checkpoints(path)
    if not found:
        raise PlelabError(f"{path} holds no plelab checkpoint; give a run folder written by plelab train "
                          "or one of its checkpoints/step-N folders")
    return found[-1]


def load_for_eval(path: str | Path, device: str | torch.device = "cpu",
                  mmap_table: bool = True) -> tuple[PLECausalLM, RunConfig]:
    """A trained text model in eval mode, ``(model, config)``, from a run or checkpoint folder.

    With ``mmap_table`` the table stays a read-only map of the file on the host (whatever ``device``);
    otherwise it is read into memory on ``device`` like every other tensor.
    """
    from plelab.training.checkpoint import read_state

    ckpt = checkpoint_of(path)
    cfg = RunConfig.from_dict(read_state(ckpt, for_resume=False)["config"])
    if cfg.visual.enabled:
        raise PlelabError(f"{ckpt} is a visual run; load_for_eval reads text models")
    with torch.device("meta"):
        model = PLECausalLM(cfg.model, cfg.ple)
    tm = model.model
    file = ckpt / "model.safetensors"
    mapped = mmap_table and cfg.ple.enabled
    materialise(model, device, None if mapped else device)
    table = tm.embed_tokens_per_layer if mapped else None
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            saved = set(f.keys())
            params = [(n, p) for n, p in model.named_parameters() if not (mapped and n == TABLE_KEY)]
            missing = [n for n, _ in params if n not in saved]
            if missing:
                raise PlelabError(f"{file} lacks {missing[0]}; it does not fit the run's config")
            with torch.no_grad():
                for name, p in params:
                    t = f.get_tensor(name)
                    if tuple(t.shape) != tuple(p.shape):
                        raise PlelabError(f"{file}: {name} has shape {tuple(t.shape)}, the config expects "
                                          f"{tuple(p.shape)}")
                    p.copy_(t)
    except (SafetensorError, OSError) as err:
        why = (str(err).splitlines() or [repr(err)])[0]
        raise PlelabError(f"{file} is not a readable safetensors file ({why})") from None
    if table is not None:
        weight = mmap_tensor(file, TABLE_KEY)
        expected = (tm.ple_vocab_size, cfg.model.num_hidden_layers * cfg.ple.dim)
        if tuple(weight.shape) != expected:
            raise PlelabError(f"{file}: {TABLE_KEY} has shape {tuple(weight.shape)}, the config expects {expected}")
        table.weight = torch.nn.Parameter(weight, requires_grad=False)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval(), cfg
