"""Checkpoints: safetensors weights with HF names, optimizer moments, RNG and loop state. No pickle.

Layout of ``RUN/checkpoints/step-000100/``:

- ``model.safetensors``: the full model state dict (HF Gemma names, tied embedding once);
- ``optimizer.safetensors``: per parameter ``{name}.exp_avg``, ``{name}.exp_avg_sq``,
  ``{name}.step``, plus ``rng.torch_cpu`` (and ``rng.cuda`` on GPU);
- ``state.json``: format tag, step, tokens seen, validation history, config, corpus fingerprint; checked against
  one schema (:data:`STATE_SCHEMA`: types, the step within the run's steps and equal to its folder's) before a
  resume or a reader uses any of it.

A checkpoint is written into a temporary folder and renamed into place, so a crash (even
``kill -9``) mid-write leaves the previous checkpoints untouched and no half checkpoint
visible. Under DDP the full state is gathered and rank 0 writes it; a sharded (FSDP2) run writes a sharded
checkpoint instead, each rank its own rows (:mod:`plelab.training.sharded_checkpoint`), which any world size
resumes from. Loading reads either layout.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from plelab.config.schema import RunConfig
from plelab.distributed import DistInfo, all_ranks_ok, barrier
from plelab.errors import PlelabError
from plelab.faults import maybe_fault
from plelab.io import replace_synced, save_safetensors, temp_dir, write_failure, write_json
from plelab.model.loading import check_tensors
from plelab.training import sharded_checkpoint as sharded

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


def _fresh_tmp(root: Path, final: str, tag: str | None = None) -> Path:
    """A new temporary folder ``{final}.tmp-{tag}`` in ``root`` (random tag when None), after removing what a crash
    mid-write left there."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob("*.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if tag is None:
        return temp_dir(root, prefix=f"{final}.tmp-")
    tmp = root / f"{final}.tmp-{tag}"
    tmp.mkdir()
    return tmp


def _write_failed(run_dir: Path, root: Path, final: Path, tmp: Path, why: str) -> PlelabError:
    shutil.rmtree(tmp, ignore_errors=True)
    kept = [p.name for p in list_checkpoints(run_dir)]
    then = (f"the previous checkpoint {kept[-1]} is intact — free space and continue with --resume" if kept
            else "no earlier checkpoint exists — free space and start the run again")
    return PlelabError(f"cannot write checkpoint {final.name} in {root}: {why}; {then}")


def _publish(run_dir: Path, tmp: Path, final: Path, keep: int, protect: int) -> Path:
    """Rename the finished ``tmp`` to ``final`` (its files synced first, so that no power loss leaves a named
    checkpoint with empty files), then delete all but the newest ``keep`` (never ``step-{protect}``)."""
    if final.exists():  # a re-save of the same step (resume that ended exactly here)
        shutil.rmtree(final)
    replace_synced(tmp, final)
    for old in [p for p in list_checkpoints(run_dir) if p.name != f"step-{protect:06d}"][:-keep]:
        trash = old.with_name(old.name + ".tmp-old")
        old.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)
    return final


def save_checkpoint(run_dir: Path, step: int, model_tensors: dict, opt_tensors: dict, state: dict,
                    keep: int, extra_tensors: dict | None = None, diagnostics: dict | None = None,
                    protect: int = 0) -> Path:
    """Write ``step-{step}`` atomically, then delete all but the newest ``keep`` checkpoints
    (``step-{protect}`` is never deleted: the early checkpoint of ``train.early_checkpoint``)."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step-{step:06d}"
    tmp = _fresh_tmp(root, final.name)
    rng = {"rng.torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["rng.cuda"] = torch.cuda.get_rng_state()
    try:
        save_safetensors(model_tensors, tmp / "model.safetensors", metadata={"format": FORMAT})
        maybe_fault("mid_checkpoint", step)
        save_safetensors({**opt_tensors, **rng, **(extra_tensors or {})}, tmp / "optimizer.safetensors",
                         metadata={"format": FORMAT})
        if diagnostics is not None:
            write_json(tmp / "diagnostics.json", diagnostics)
        write_json(tmp / "state.json", {"format": FORMAT, "step": step, **state})
    except (OSError, SafetensorError) as err:  # e.g. no space left on device: the half checkpoint goes
        raise _write_failed(run_dir, root, final, tmp, write_failure(err)) from None
    return _publish(run_dir, tmp, final, keep, protect)


def save_sharded_checkpoint(run_dir: Path, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer,
                            state: dict, keep: int, info: DistInfo, extra_tensors: dict | None = None,
                            diagnostics: dict | None = None, protect: int = 0) -> Path:
    """The sharded counterpart of :func:`save_checkpoint` for an FSDP2 model: collective (every rank calls it with
    the same ``state``; ``extra_tensors`` and ``diagnostics`` matter on rank 0). Rank 0 makes
    ``step-N.tmp-sharded``, every rank writes its shards into it, rank 0 renames it into place."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step-{step:06d}"
    tmp = root / f"{final.name}.tmp-{sharded.SHARDED}"
    why = ""
    if info.is_main:
        try:
            _fresh_tmp(root, final.name, sharded.SHARDED)
        except OSError as err:
            why = err.strerror or str(err)
    if not all_ranks_ok(not why, info):
        raise _write_failed(run_dir, root, final, tmp, why or "rank 0 could not create its folder")
    try:
        sharded.save_sharded(tmp, step, model, opt, state, extra_tensors or {}, diagnostics, info, FORMAT)
    except PlelabError as err:
        if info.is_main:
            raise _write_failed(run_dir, root, final, tmp, str(err)) from None
        raise
    if info.is_main:
        _publish(run_dir, tmp, final, keep, protect)
    barrier(info)
    return final


def latest_intact(run_dir: Path, log=print) -> Path | None:
    """The newest checkpoint to resume from. A sharded checkpoint found torn (a rank's file missing, short or
    unreadable — e.g. a copy of the run folder that stopped halfway) is passed over, saying so, for the one before.
    A damaged single-file checkpoint is reported when it is loaded."""
    found = list_checkpoints(run_dir)
    for ckpt in reversed(found):
        reason = sharded.torn_reason(ckpt) if sharded.is_sharded(ckpt) else None
        if reason is None:
            return ckpt
        log(f"checkpoint {ckpt.name} is torn ({reason}): resuming from the one before it")
    if found:
        raise PlelabError(f"every checkpoint of {run_dir} is torn; start the run again with another --out")
    return None


def model_file(ckpt: Path) -> Path:
    """``model.safetensors`` of a checkpoint folder; a sharded one must be consolidated first (one line saying how)."""
    file = Path(ckpt) / "model.safetensors"
    if not file.exists() and sharded.is_sharded(ckpt):
        raise PlelabError(f"{ckpt} is a sharded checkpoint (an FSDP2 run): write its model.safetensors with "
                          f"`plelab consolidate {ckpt}` first")
    return file


def consolidate_checkpoint(path: str | Path, log=print) -> Path:
    """Write the single-file ``model.safetensors`` of a sharded checkpoint (``path``: a run folder, meaning its
    latest intact checkpoint, or a ``checkpoints/step-N`` folder), so that ``plelab eval``, ``diagnose`` and
    ``export`` read it. One process; it holds the full weights in host memory once. Returns the file written."""
    path = Path(path)
    if not path.is_dir():
        raise PlelabError(f"{path} is not a folder; give a run folder or one of its checkpoints/step-N folders")
    ckpt = path if (path / "state.json").exists() else latest_intact(path, log)
    if ckpt is None:
        raise PlelabError(f"{path} holds no plelab checkpoint; give a run folder written by plelab train or one of "
                          "its checkpoints/step-N folders")
    return sharded.consolidate_folder(ckpt)


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.exists():
        raise PlelabError(f"{path.parent} is not a plelab checkpoint (no {path.name}); "
                          "point at a RUN folder written by plelab train")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise PlelabError(f"checkpoint file {path} is damaged or truncated ({str(err).splitlines()[0]}); "
                          "delete that checkpoint folder to resume from the previous one") from None


def _count(v, least: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def _number(v) -> bool:
    """A JSON number, or null (how a non-finite float is written)."""
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


# state.json's schema: key -> (what its value must be, the test); every key present is checked, whoever reads it.
STATE_SCHEMA = {
    "step": ("an integer >= 0", _count),
    "tokens_seen": ("an integer >= 0", _count),
    "val_history": ("a list of [step, loss] pairs", lambda v: isinstance(v, list) and all(
        isinstance(p, list) and len(p) == 2 and _count(p[0]) and _number(p[1]) for p in v)),
    "config": ("an object", lambda v: isinstance(v, dict)),
    "config.train": ("an object", lambda v: isinstance(v, dict)),  # its section train (the others: RunConfig)
    "recent_train_losses": ("a list of numbers", lambda v: isinstance(v, list) and all(map(_number, v))),
    "wall_seconds": ("a number >= 0", lambda v: _number(v) and v is not None and v >= 0),
    "corpus_fingerprint": ("a string", lambda v: isinstance(v, str)),
    "table_decay_alpha": ("a number", _number),
    "skipped_steps": ("an integer >= 0", _count),
    "world_size": ("an integer >= 1", lambda v: _count(v, 1)),
    "extra": ("an object", lambda v: isinstance(v, dict)),
}


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_state(state: dict, path: Path) -> None:
    """Refuse, in one line, a ``state.json`` (at ``path``) whose values do not fit :data:`STATE_SCHEMA`, whose step
    lies outside ``[0, train.steps]`` of the config it records, or disagrees with its folder's name ``step-N``."""
    fix = (f"the checkpoint is damaged or was edited — delete {path.parent.name} to resume from the one before it, "
           "or restore its state.json (nothing was changed)")
    config = state.get("config")
    train = config.get("train", {}) if isinstance(config, dict) else {}
    for key, (what, ok) in STATE_SCHEMA.items():
        value = train if key == "config.train" else state.get(key)
        if (key in state or key == "config.train") and not ok(value):
            raise PlelabError(f"checkpoint state {path}: {key} is {_shown(value)}, not {what}; {fix}")
    step, steps = state.get("step"), train.get("steps")
    if step is not None and _count(steps) and step > steps:
        raise PlelabError(f"checkpoint state {path}: step {_shown(step)} is beyond train.steps={steps} of the run it "
                          f"records; {fix}")
    named = _STEP_DIR.match(path.parent.name)
    if step is not None and named and int(named.group(1)) != step:
        raise PlelabError(f"checkpoint state {path}: step {step} disagrees with its folder {path.parent.name}; {fix}")


def read_state(ckpt: Path, for_resume: bool = True) -> dict:
    """``state.json`` of a checkpoint, checked (:func:`check_state`) before anything is done with it; reading
    (``for_resume=False``) needs only config and step."""
    path = ckpt / "state.json"
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlelabError(f"{ckpt} is not a plelab checkpoint (no state.json)") from None
    except (OSError, ValueError, RecursionError) as err:
        raise PlelabError(f"checkpoint state {path} is unreadable ({str(err).splitlines()[0]}); delete that "
                          "checkpoint folder") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise PlelabError(f"{ckpt} has format {state.get('format') if isinstance(state, dict) else None!r}, "
                          f"expected {FORMAT}; it was not written by this plelab")
    missing = [k for k in (_STATE_KEYS if for_resume else ("step", "config")) if k not in state]
    if missing:
        raise PlelabError(f"checkpoint state {path} lacks {missing[0]!r}; the checkpoint is damaged — delete it "
                          "to resume from the previous one")
    check_state(state, path)
    return state


# The fix a checkpoint that does not fit (altered, another config) is refused with.
REFUSED_FIX = ("resume with the run's own config, or delete that checkpoint folder to resume from the one before "
               "(nothing was changed)")


def load_model_weights(model: torch.nn.Module, ckpt: Path) -> None:
    """Load ``model.safetensors`` into ``model`` (plain, DDP-wrapped or FSDP2-sharded), after checking every
    tensor's name, dtype and shape against the model (:func:`~plelab.model.loading.check_tensors`); a sharded
    checkpoint is read by the ranks in parallel, resharded to this run's world size."""
    if sharded.is_sharded(ckpt):
        sharded.load_sharded_weights(model, ckpt, REFUSED_FIX)
        return
    tensors = _load_tensors(Path(ckpt) / "model.safetensors")
    # parameters and persistent buffers (a remap's id -> row map)
    check_tensors(f"checkpoint {ckpt}", tensors, model.state_dict(keep_vars=True), REFUSED_FIX)
    set_model_state_dict(model, tensors, options=_FULL_ALL_RANKS)


def _param_names(groups: list[dict]) -> list[str]:
    return [n for group in groups for n in group["params"]]


def optimizer_expected(model: torch.nn.Module, names: list[str], extra: dict | None = None) -> dict:
    """What an optimizer file must hold, by name: AdamW's moments of each parameter in ``names`` (its dtype and
    shape), its step count (a scalar of AdamW's scalar dtype), the CPU RNG state, and ``extra`` (the row counts
    and the task's tensors, as the run holds them now)."""
    params = dict(model.named_parameters())
    step = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32  # as torch.optim's
    out = {f"{n}.{k}": params[n] for n in names for k in ("exp_avg", "exp_avg_sq")}
    out.update({f"{n}.step": (step, ()) for n in names})
    out["rng.torch_cpu"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["rng.cuda"] = torch.cuda.get_rng_state()
    return {**out, **(extra or {})}


def load_optimizer_state(model: torch.nn.Module, opt: torch.optim.Optimizer, ckpt: Path,
                         extra: dict | None = None) -> dict:
    """Restore AdamW moments and step counts, and the RNG states, after checking each tensor's dtype and shape
    (:func:`optimizer_expected`; ``extra``: the other tensors the run expects, as it holds them now). Returns the
    other (extra) tensors."""
    if sharded.is_sharded(ckpt):
        names = _param_names(get_optimizer_state_dict(model, opt)["param_groups"])
        return sharded.load_sharded_optimizer(model, opt, ckpt, optimizer_expected(model, names, extra), REFUSED_FIX)
    osd = get_optimizer_state_dict(model, opt, options=_FULL_ALL_RANKS)
    names = _param_names(osd["param_groups"])
    tensors = _load_tensors(Path(ckpt) / "optimizer.safetensors")
    check_tensors(f"checkpoint {ckpt}", tensors, optimizer_expected(model, names, extra), REFUSED_FIX,
                  complete=False, extra=True)
    state = {}
    for name in names:
        entry = {k: tensors[f"{name}.{k}"] for k in ("step", "exp_avg", "exp_avg_sq") if f"{name}.{k}" in tensors}
        if entry and len(entry) != 3:
            raise PlelabError(f"optimizer state for {name} in {ckpt} is incomplete; the checkpoint is damaged")
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
