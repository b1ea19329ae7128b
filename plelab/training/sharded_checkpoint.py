"""Sharded checkpoints of FSDP2 runs: every rank writes its own rows, a resume reshards to any world size.

Layout of ``RUN/checkpoints/step-000100/`` when the run was sharded (``train.parallel=fsdp`` under torchrun):

- ``sharded/model/shard-0000{r}-model-00001-of-00001.safetensors``: rank r's rows of every weight (HF names), with
  their offsets in the full tensor in the file's metadata;
- ``sharded/optim/shard-….safetensors``: rank r's rows of ``{name}.exp_avg`` and ``{name}.exp_avg_sq``;
- ``extra.safetensors`` (rank 0): ``{name}.step``, ``rng.torch_cpu``, the row counts and the task's tensors;
- ``state.json``: what every checkpoint holds, plus ``storage: "sharded"``, the world size and a manifest of every
  file with its size (how a torn checkpoint is recognised).

Written and read through ``torch.distributed.checkpoint`` (DCP) with its safetensors storage
(``HuggingFaceStorageWriter/Reader``): DCP plans which rank reads which saved rows, so a checkpoint written by 2
processes resumes on 3 or on 1 (resharding), and the safetensors storage keeps its index in the files' own headers
— DCP's default storage keeps it in a pickle (``.metadata``), which plelab never reads. The folder is assembled
under ``step-N.tmp-sharded`` on the run's (shared) filesystem and renamed by rank 0 once every rank has written,
like a single-file checkpoint. :func:`consolidate_folder` writes the single-file ``model.safetensors`` that
``plelab eval``, ``diagnose`` and ``export`` read.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from plelab.config.budget import check_bytes, gigabytes
from plelab.config.schema import RunConfig
from plelab.distributed import DistInfo, all_ranks_ok
from plelab.errors import PlelabError
from plelab.faults import maybe_fault
from plelab.io import replace_synced, save_safetensors, write_json
from plelab.model.init import build_model
from plelab.model.loading import check_tensors

SHARDED = "sharded"
_MOMENTS = ("exp_avg", "exp_avg_sq")


def is_sharded(ckpt: Path) -> bool:
    """True for a checkpoint folder written by :func:`save_sharded`."""
    return (Path(ckpt) / SHARDED).is_dir()


def _manifest(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()
            and p.name != "state.json"}


def save_sharded(tmp: Path, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer, state: dict,
                 extra_tensors: dict, diagnostics: dict | None, info: DistInfo, fmt: str) -> None:
    """Every rank writes its shards into ``tmp`` (made by rank 0 beforehand); then rank 0 writes
    ``extra.safetensors``, ``diagnostics.json`` and ``state.json`` with the manifest. Collective: every rank calls
    it. Raises :class:`PlelabError` on every rank when any rank could not write (``tmp`` is left for the caller)."""
    msd = get_model_state_dict(model)
    osd = get_optimizer_state_dict(model, opt)
    moments = {f"{name}.{k}": st[k] for name, st in osd["state"].items() for k in _MOMENTS if k in st}
    steps = {f"{name}.step": torch.as_tensor(st["step"]).detach().cpu().reshape(())
             for name, st in osd["state"].items() if "step" in st}
    why = ""
    try:
        dcp.save(msd, storage_writer=HuggingFaceStorageWriter(str(tmp / SHARDED / "model"), save_distributed=True))
        maybe_fault("mid_checkpoint", step)
        dcp.save(moments, storage_writer=HuggingFaceStorageWriter(str(tmp / SHARDED / "optim"),
                                                                  save_distributed=True))
    except (OSError, CheckpointException) as err:
        why = f"rank {info.rank}: {str(err).splitlines()[0] if str(err) else repr(err)}"
    if not all_ranks_ok(not why, info):
        raise PlelabError(why or "another rank could not write its shards")
    if info.is_main:
        try:
            rng = {"rng.torch_cpu": torch.get_rng_state()}
            save_safetensors({**steps, **rng, **extra_tensors}, tmp / "extra.safetensors", metadata={"format": fmt})
            if diagnostics is not None:
                write_json(tmp / "diagnostics.json", diagnostics)
            write_json(tmp / "state.json", {"format": fmt, "step": step, **state, "storage": SHARDED,
                                            "files": _manifest(tmp)})
        except (OSError, SafetensorError) as err:
            why = getattr(err, "strerror", None) or str(err).splitlines()[0]
    if not all_ranks_ok(not why, info):
        raise PlelabError(why or "rank 0 could not write the checkpoint's state")


def torn_reason(ckpt: Path) -> str | None:
    """Why the sharded checkpoint ``ckpt`` is incomplete (a file missing, short, extra or unreadable), or None."""
    try:
        state = json.loads((ckpt / "state.json").read_text())
        files = state["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return "its state.json or manifest is missing or unreadable"
    if not isinstance(files, dict) or not all(isinstance(k, str) and type(v) is int for k, v in files.items()):
        return "its manifest's files is not a map of file name to byte count"
    if not isinstance(state.get("format"), str):
        return "its state.json names no format"
    held = _manifest(ckpt)
    for name, size in files.items():
        if name not in held:
            return f"{name} is missing"
        if held[name] != size:
            return f"{name} has {held[name]} bytes, {size} were written"
    extra = sorted(set(held) - set(files) - {"model.safetensors", "model.safetensors.tmp"})  # consolidation's
    if extra:
        return f"{extra[0]} was not written with it"
    for name in files:
        if name.endswith(".safetensors"):
            try:
                with safe_open(str(ckpt / name), framework="pt"):
                    pass
            except (SafetensorError, OSError) as err:
                return f"{name} is unreadable ({str(err).splitlines()[0]})"
    return None


def _dcp_load(state: dict, folder: Path) -> None:
    """``dcp.load`` from a safetensors-storage folder, in place; in one process without DCP's warning that it is."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=HuggingFaceStorageReader(str(folder)))


def _read_metadata(folder: Path, where: str, fix: str):
    """DCP's metadata of a sharded folder, read from its safetensors headers (the files' own metadata holds each
    piece's offsets): one line instead of DCP's ``KeyError`` / ``JSONDecodeError`` when a header is damaged."""
    try:
        return HuggingFaceStorageReader(str(folder)).read_metadata()
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, SafetensorError) as err:
        why = " ".join(str(err).split())[:200] or type(err).__name__
        raise PlelabError(f"{where}: the headers of its {folder.name} shards are damaged ({type(err).__name__}: "
                          f"{why}); {fix}") from None


def _covered_once(chunks: list, size: tuple[int, ...]) -> str | None:
    """Why the saved pieces ``chunks`` (offsets and sizes) of a tensor of shape ``size`` do not hold each element
    exactly once (a piece outside the tensor, two pieces overlapping, elements no piece holds), or None."""
    boxes = [(tuple(c.offsets), tuple(c.sizes)) for c in chunks]
    for off, sz in boxes:
        if len(off) != len(size) or any(o < 0 or o + n > s for o, n, s in zip(off, sz, size)):
            return f"a piece at offsets {list(off)} of shape {list(sz)} lies outside its shape {list(size)}"
    if all(off[1:] == (0,) * (len(size) - 1) and sz[1:] == size[1:] for off, sz in boxes) and size:
        end = 0  # pieces of whole rows (FSDP2's): sorted by first row they must tile [0, rows)
        for off, sz in sorted(boxes):
            if off[0] != end:
                what = "held twice" if off[0] < end else "held by no shard"
                lo, hi = sorted((off[0], end))
                return f"rows {lo:,}–{hi - 1:,} are {what}"
            end = off[0] + sz[0]
        return None if end == size[0] else f"rows {end:,}–{size[0] - 1:,} are held by no shard"
    for i, (a, sa) in enumerate(boxes):  # pieces of another form: pairwise, then the count
        for b, sb in boxes[i + 1:]:
            if all(x < y + m and y < x + n for x, n, y, m in zip(a, sa, b, sb)) and math.prod(sa) and math.prod(sb):
                return f"the pieces at offsets {list(a)} and {list(b)} overlap"
    held, full = sum(math.prod(sz) for _, sz in boxes), math.prod(size)
    return None if held == full else f"its pieces hold {held:,} of its {full:,} elements"


def _check_pieces(meta, where: str, fix: str) -> None:
    """Refuse a sharded folder whose pieces of a tensor disagree on its dtype (a relabelled header: DCP takes the
    first file's and converts the others' bytes), or do not hold each element exactly once (overlapping offsets
    leave elements at ``torch.empty``'s garbage on consolidation, at the fresh init on resume)."""
    stored: dict[str, dict[torch.dtype, str]] = {}
    for index, info in meta.storage_data.items():
        stored.setdefault(index.fqn, {}).setdefault(info.dtype, Path(info.relative_path).name)
    for name, m in meta.state_dict_metadata.items():
        kinds = stored.get(name, {})
        if len(kinds) > 1:
            (a, fa), (b, fb) = sorted(kinds.items(), key=str)[:2]
            raise PlelabError(f"{where}: {name} is stored as {str(a).removeprefix('torch.')} in {fa} and as "
                              f"{str(b).removeprefix('torch.')} in {fb} — a header was altered; {fix}")
        why = _covered_once(m.chunks, tuple(m.size))
        if why is not None:
            raise PlelabError(f"{where}: the saved pieces of {name} do not hold it exactly once ({why}); its shard "
                              f"offsets are damaged — {fix}")


def _saved_specs(folder: Path, where: str, fix: str) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """``{name: (dtype, full shape)}`` of a sharded folder, from the safetensors storage's metadata alone, once its
    pieces were checked (:func:`_check_pieces`)."""
    meta = _read_metadata(folder, where, fix)
    _check_pieces(meta, where, fix)
    return {k: (v.properties.dtype, tuple(v.size)) for k, v in meta.state_dict_metadata.items()}


def load_sharded_weights(model: torch.nn.Module, ckpt: Path, fix: str) -> None:
    """Load a sharded checkpoint's weights into ``model`` (FSDP2 at any world size, DDP or one process): each rank
    reads only the saved rows its own shard needs, once every tensor's name, dtype and shape were checked."""
    sd = get_model_state_dict(model)
    check_tensors(f"checkpoint {ckpt}", _saved_specs(ckpt / SHARDED / "model", f"checkpoint {ckpt}", fix), sd, fix)
    _dcp_load(sd, ckpt / SHARDED / "model")
    set_model_state_dict(model, sd)


def load_sharded_optimizer(model: torch.nn.Module, opt: torch.optim.Optimizer, ckpt: Path, expected: dict,
                           fix: str) -> dict:
    """Restore the AdamW moments (resharded), step counts and the RNG state, each tensor checked against
    ``expected`` (:func:`plelab.training.checkpoint.optimizer_expected`); returns the other extra tensors."""
    extra = load_file(str(ckpt / "extra.safetensors"))
    params = dict(model.named_parameters())
    groups = get_optimizer_state_dict(model, opt)["param_groups"]
    saved = _saved_specs(ckpt / SHARDED / "optim", f"checkpoint {ckpt}", fix)
    held = [n for group in groups for n in group["params"] if f"{n}.exp_avg" in saved]
    moments = {f"{n}.{k}": expected[f"{n}.{k}"] for n in held for k in _MOMENTS}
    check_tensors(f"checkpoint {ckpt}", saved, moments, fix)
    check_tensors(f"checkpoint {ckpt}", extra, expected, fix, complete=False, extra=True)
    target = {f"{n}.{k}": torch.zeros_like(params[n]) for n in held for k in _MOMENTS}
    _dcp_load(target, ckpt / SHARDED / "optim")
    missing = [n for n in held if f"{n}.step" not in extra]
    if missing:
        raise PlelabError(f"optimizer state for {missing[0]} in {ckpt} is incomplete; the checkpoint is damaged")
    state = {n: {"step": extra[f"{n}.step"], **{k: target[f"{n}.{k}"] for k in _MOMENTS}} for n in held}
    set_optimizer_state_dict(model, opt, {"state": state, "param_groups": groups})
    torch.set_rng_state(extra["rng.torch_cpu"])
    return {k: v for k, v in extra.items() if not k.endswith(".step") and not k.startswith("rng.")}


def _check_claimed_sizes(ckpt: Path, meta: dict) -> None:
    """Refuse, before anything is allocated, full tensor sizes the shards' metadata claims but their saved rows do
    not cover (a row offset past the rows written), and a whole that does not fit in the host's memory."""
    need = 0
    for name, m in meta.items():
        full, held = math.prod(m.size), sum(math.prod(c.sizes) for c in m.chunks)
        claimed = full * m.properties.dtype.itemsize
        if held < full:
            raise PlelabError(f"checkpoint {ckpt}: the shards of {name} hold {held:,} of the {full:,} elements its "
                              f"metadata claims (shape {list(m.size)}, {gigabytes(claimed)} to allocate); its "
                              "offsets are damaged — consolidate an earlier checkpoint")
        need += claimed
    check_bytes(f"consolidating {ckpt}", need, "consolidate on a machine with more memory")


def _check_against_the_run(ckpt: Path, meta: dict) -> None:
    """Refuse shards whose tensors (names, dtypes, full shapes) are not the run's model's — built on the meta device
    from the checkpoint's own config — before anything is allocated or written. (A state.json without a config, not
    one plelab's trainer writes, is consolidated unchecked, as before.)"""
    try:
        saved = json.loads((ckpt / "state.json").read_text()).get("config")
        if saved is None:
            return
        cfg = RunConfig.from_dict(saved)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, PlelabError) as err:
        raise PlelabError(f"checkpoint {ckpt}: its state.json holds no readable run config ({err}); consolidate an "
                          "earlier checkpoint") from None
    model = build_model(cfg.model, cfg.ple, device="meta", ac=cfg.aux)
    found = {name: (m.properties.dtype, tuple(m.size)) for name, m in meta.items()}
    check_tensors(f"checkpoint {ckpt} (its shards)", found, model.state_dict(keep_vars=True),
                  "consolidate an earlier checkpoint")


def consolidate_folder(ckpt: Path) -> Path:
    """Write ``model.safetensors`` (the full weights, HF names) into a sharded checkpoint folder, in one process;
    the weights are read whole (host memory: the model's size). Returns the file; a second call rewrites it."""
    ckpt = Path(ckpt)
    if not is_sharded(ckpt):
        raise PlelabError(f"{ckpt} is not a sharded checkpoint (no {SHARDED}/ folder); only checkpoints of "
                          "train.parallel=fsdp runs under torchrun need consolidating")
    reason = torn_reason(ckpt)
    if reason is not None:
        raise PlelabError(f"checkpoint {ckpt} is torn: {reason}; consolidate an earlier one")
    folder = ckpt / SHARDED / "model"
    read = _read_metadata(folder, f"checkpoint {ckpt}", "consolidate an earlier checkpoint")
    meta = read.state_dict_metadata
    _check_claimed_sizes(ckpt, meta)
    _check_pieces(read, f"checkpoint {ckpt}", "consolidate an earlier checkpoint")
    _check_against_the_run(ckpt, meta)
    sd = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype) for k, v in meta.items()}
    _dcp_load(sd, folder)
    fmt = json.loads((ckpt / "state.json").read_text())["format"]
    out, tmp = ckpt / "model.safetensors", ckpt / "model.safetensors.tmp"
    try:
        save_safetensors(sd, tmp, metadata={"format": fmt})
        replace_synced(tmp, out)
    except (OSError, SafetensorError) as err:
        tmp.unlink(missing_ok=True)
        raise PlelabError(f"cannot write {out}: {getattr(err, 'strerror', None) or err}") from None
    return out
