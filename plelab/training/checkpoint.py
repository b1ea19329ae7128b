"""Checkpoints: safetensors weights with HF names, optimizer moments, RNG and loop state. No pickle.

Layout of ``RUN/checkpoints/step-000100/``:

- ``model.safetensors``: the full model state dict (HF Gemma names, tied embedding once);
- ``optimizer.safetensors``: per parameter ``{name}.exp_avg``, ``{name}.exp_avg_sq``,
  ``{name}.step``, plus ``rng.torch_cpu`` (and ``rng.cuda`` on GPU);
- ``state.json``: format tag, step, tokens seen, validation history, config, corpus fingerprint.

A checkpoint is written into a temporary folder and renamed into place, so a crash (even
``kill -9``) mid-write leaves the previous checkpoints untouched and no half checkpoint
visible. Under DDP / FSDP2 the full (unsharded) state is gathered and rank 0 writes it.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from plelab.config.schema import RunConfig
from plelab.errors import PlelabError
from plelab.faults import maybe_fault
from plelab.io import write_json

FORMAT = "plelab-checkpoint-v1"
_STEP_DIR = re.compile(r"^step-(\d{6,})$")
# Gathering for a save: full tensors, offloaded to CPU on rank 0 (other ranks get empty dicts).
_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
# Loading: every rank reads the files and passes full tensors; FSDP2 keeps its own shard.
_FULL_ALL_RANKS = StateDictOptions(full_state_dict=True)
_STATE_KEYS = ("step", "tokens_seen", "val_history", "config", "recent_train_losses", "wall_seconds",
               "corpus_fingerprint")


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temporary folders are ignored)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name)]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def gather_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Full model and optimizer tensors as flat name -> CPU tensor dicts (collective under DDP/FSDP)."""
    msd = get_model_state_dict(model, options=_FULL)
    osd = get_optimizer_state_dict(model, opt, options=_FULL)
    flat = {f"{name}.{k}": v for name, st in osd.get("state", {}).items() for k, v in st.items() if torch.is_tensor(v)}
    return ({k: v.detach().contiguous() for k, v in msd.items()},
            {k: v.detach().contiguous() for k, v in flat.items()})


def save_checkpoint(run_dir: Path, step: int, model_tensors: dict, opt_tensors: dict, state: dict,
                    keep: int, extra_tensors: dict | None = None, diagnostics: dict | None = None,
                    protect: int = 0) -> Path:
    """Write ``step-{step}`` atomically, then delete all but the newest ``keep`` checkpoints
    (``step-{protect}`` is never deleted: the early checkpoint of ``train.early_checkpoint``)."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob("*.tmp-*"):  # left by a crash mid-write
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step-{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f"{final.name}.tmp-", dir=root))
    rng = {"rng.torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["rng.cuda"] = torch.cuda.get_rng_state()
    try:
        save_file(model_tensors, str(tmp / "model.safetensors"), metadata={"format": FORMAT})
        maybe_fault("mid_checkpoint", step)
        save_file({**opt_tensors, **rng, **(extra_tensors or {})}, str(tmp / "optimizer.safetensors"),
                  metadata={"format": FORMAT})
        if diagnostics is not None:
            write_json(tmp / "diagnostics.json", diagnostics)
        write_json(tmp / "state.json", {"format": FORMAT, "step": step, **state})
    except (OSError, SafetensorError) as err:  # e.g. no space left on device: the half checkpoint goes
        shutil.rmtree(tmp, ignore_errors=True)
        kept = [p.name for p in list_checkpoints(run_dir)]
        why = getattr(err, "strerror", None) or (str(err).splitlines() or [repr(err)])[0]
        then = (f"the previous checkpoint {kept[-1]} is intact — free space and continue with --resume" if kept
                else "no earlier checkpoint exists — free space and start the run again")
        raise PlelabError(f"cannot write checkpoint {final.name} in {root}: {why}; {then}") from None
    if final.exists():  # a re-save of the same step (resume that ended exactly here)
        shutil.rmtree(final)
    tmp.rename(final)
    for old in [p for p in list_checkpoints(run_dir) if p.name != f"step-{protect:06d}"][:-keep]:
        trash = old.with_name(old.name + ".tmp-old")
        old.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)
    return final


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.exists():
        raise PlelabError(f"{path.parent} is not a plelab checkpoint (no {path.name}); "
                          "point at a RUN folder written by plelab train")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise PlelabError(f"checkpoint file {path} is damaged or truncated ({str(err).splitlines()[0]}); "
                          "delete that checkpoint folder to resume from the previous one") from None


def read_state(ckpt: Path, for_resume: bool = True) -> dict:
    """``state.json`` of a checkpoint, checked; reading (``for_resume=False``) needs only config and step."""
    path = ckpt / "state.json"
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlelabError(f"{ckpt} is not a plelab checkpoint (no state.json)") from None
    except (OSError, ValueError) as err:
        raise PlelabError(f"checkpoint state {path} is unreadable ({err}); delete that checkpoint folder") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise PlelabError(f"{ckpt} has format {state.get('format') if isinstance(state, dict) else None!r}, "
                          f"expected {FORMAT}; it was not written by this plelab")
    missing = [k for k in (_STATE_KEYS if for_resume else ("step", "config")) if k not in state]
    if missing:
        raise PlelabError(f"checkpoint state {path} lacks {missing[0]!r}; the checkpoint is damaged — delete it "
                          "to resume from the previous one")
    return state


def load_model_weights(model: torch.nn.Module, ckpt: Path) -> None:
    """Load ``model.safetensors`` into ``model`` (plain, DDP-wrapped or FSDP2-sharded), checking names and shapes."""
    tensors = _load_tensors(Path(ckpt) / "model.safetensors")
    expected = {name: p for name, p in model.named_parameters()}
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        what = f"missing {missing[0]}" if missing else f"unexpected {extra[0]}"
        raise PlelabError(f"checkpoint {ckpt} does not fit this model ({what}); it was trained with another config")
    for name, t in tensors.items():
        if tuple(t.shape) != tuple(expected[name].shape):
            raise PlelabError(f"checkpoint {ckpt} does not fit this model: {name} has shape {tuple(t.shape)}, "
                              f"the model expects {tuple(expected[name].shape)} (another config)")
    set_model_state_dict(model, tensors, options=_FULL_ALL_RANKS)


def load_optimizer_state(model: torch.nn.Module, opt: torch.optim.Optimizer, ckpt: Path) -> dict:
    """Restore AdamW moments and step counts, and the RNG states. Returns the other (extra) tensors."""
    tensors = _load_tensors(Path(ckpt) / "optimizer.safetensors")
    osd = get_optimizer_state_dict(model, opt, options=_FULL_ALL_RANKS)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    names = [n for group in osd["param_groups"] for n in group["params"]]
    state = {}
    for name in names:
        entry = {k: tensors[f"{name}.{k}"] for k in ("step", "exp_avg", "exp_avg_sq") if f"{name}.{k}" in tensors}
        if entry and len(entry) != 3:
            raise PlelabError(f"optimizer state for {name} in {ckpt} is incomplete; the checkpoint is damaged")
        for k in ("exp_avg", "exp_avg_sq"):
            if entry and tuple(entry[k].shape) != shapes[name]:
                raise PlelabError(f"optimizer state {name}.{k} in {ckpt} has shape {tuple(entry[k].shape)}, "
                                  f"the model expects {shapes[name]}; the checkpoint does not fit this config")
        if entry:
            state[name] = entry
    set_optimizer_state_dict(model, opt, {"state": state, "param_groups": osd["param_groups"]},
                             options=_FULL_ALL_RANKS)
    if "rng.torch_cpu" in tensors:
        torch.set_rng_state(tensors["rng.torch_cpu"])
    if "rng.cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng.cuda"])
    moments = {f"{n}.{k}" for n in names for k in ("step", "exp_avg", "exp_avg_sq")}
    return {k: v for k, v in tensors.items() if k not in moments and not k.startswith("rng.")}


def _lookup(d: dict, key: str):
    for part in key.split("."):
        d = d[part]
    return d


def check_resumable(run: Path, state: dict, cfg, keys: tuple[str, ...], fingerprint: str) -> None:
    """Refuse to resume ``run`` from a checkpoint ``state`` trained with other values of ``keys`` (config
    keys that change what a step computes) or on another corpus."""
    try:  # through the config class: a section added since the checkpoint reads as its defaults
        saved = RunConfig.from_dict(state["config"]).to_dict()
    except PlelabError as err:
        raise PlelabError(f"cannot resume {run}: its checkpoint's config is not valid here ({err})") from None
    now = cfg.to_dict()
    for key in keys:
        if _lookup(saved, key) != _lookup(now, key):
            raise PlelabError(f"cannot resume {run}: its checkpoint was trained with a different {key}; "
                              "resume with the run's own config or start a new --out")
    if state["corpus_fingerprint"] != fingerprint:
        raise PlelabError(f"cannot resume {run}: it was trained on another corpus (sha256 "
                          f"{state['corpus_fingerprint'][:12]}…, now {fingerprint[:12]}…); pass the run's own --data")
