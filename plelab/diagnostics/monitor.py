"""Table diagnostics for any training loop: :class:`Monitor` (plelab's live and at-checkpoint diagnostics, by hooks)
of a PLE table or another kind of the family (value embeddings, a hashed n-gram table, token modulation).

In a plain loop::

    monitor = plelab.Monitor(model, "runs/mine", every=10, checkpoint_every=100, val_windows=val)
    for step in range(steps):
        loss = model(ids, labels=ids).loss
        loss.backward()
        monitor.step(step)          # after backward, before zero_grad: gradients are read here
        opt.step(); opt.zero_grad()
    monitor.close()

What it writes (rank 0; the row counts are summed over ranks under torchrun), in plelab's own formats:

- ``metrics.jsonl``: every ``every`` steps a row ``{"step", "diag": {...}}`` — per-layer injection SNR, gate
  activity, table/projection RMS ratio, branch effective rank, gradient norms of table slice / gate / projection
  vs the layer's trunk, and the share of table rows looked up so far (:mod:`plelab.diagnostics.signal`);
- ``checkpoints/step-00000N/``: ``diagnostics.json`` (structure of W_t and Δ = W_t − W_0 on the used rows, and the use
  test on ``val_windows``), ``ple_table.safetensors`` (the table and ``diag.row_counts``) — what ``plelab diagnose``
  reads;
- ``monitor.json``: the table's kind, state-dict key, shape ``[rows, layers, dim]`` and where W_0 comes from.

Another kind of table (:func:`plelab.attach_table`, or plelab's ``ValueEmbeddings`` / ``HashedNgramEmbedding`` /
``TokenModulation`` in your decoder) is monitored the same way, with the rows its ``embed`` looks up counted (token
ids; hash buckets for the n-gram table) and, every ``every`` steps, the share of rows touched and the table's gradient
norm (the per-layer signal metrics read PLE's injection, which the other kinds do not have). Its checkpoint file
keeps the table under its own key (``model.value_embeddings.embed.weight``, …), and its W_0 is always written to
``w0.safetensors`` (regenerated from the seed :func:`plelab.attach_table` recorded, else the snapshot), so
``plelab diagnose`` reads it without the model.

Steps are counted as plelab's trainer counts them: completed optimizer steps, 1-based (``monitor.step(i)`` after
the backward of the loop's step ``i``, 0-based, writes its row as step ``i + 1``; ``checkpoints/step-N`` holds the
table after N steps). :meth:`Monitor.finish` writes the last step's checkpoint (the final verdict) if the schedule
did not; :meth:`Monitor.state_dict` / :meth:`Monitor.load_state_dict` carry the row counts across a resume, so
they never restart; :meth:`Monitor.log` adds the host loop's loss and learning rate to ``metrics.jsonl`` and
:meth:`Monitor.scalars` gives the latest diagnostics as flat numbers for a logger; :meth:`Monitor.check_optimizer`
warns when the optimizer decays the table (Δ = W_t − W_0 assumes it does not).

W_0: regenerated from the seed when :func:`plelab.attach` initialised the table (its arguments are in the model's
config), otherwise one snapshot of the table at construction, written to ``w0.safetensors`` and memory-mapped at
each checkpoint (disk: one table's bytes; memory: none held between checkpoints).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn

from plelab.diagnostics.live import table_diagnostics
from plelab.diagnostics.signal import SignalProbe, gradient_norms, table_gradient_norm
from plelab.distributed import DistInfo, sum_across_ranks
from plelab.errors import PlelabError
from plelab.io import atomic_write, naming, os_reason, write_json
from plelab.model.init import aux_modules
from plelab.model.loading import mmap_tensor
from plelab.model.ple import TABLE_KEY, PLEModules
from plelab.model.tables import aux_table_key, model_table
from plelab.model.transformer import AUX_CLASSES
from plelab.training.rows import RowCounter

W0_FILE, TABLE_FILE, COUNTS_KEY = "w0.safetensors", "ple_table.safetensors", "diag.row_counts"
ATTACH_CONFIG_KEY = "plelab_ple"  # where plelab.attach keeps its arguments in an HF config
TABLE_CONFIG_KEY = "plelab_table"  # where plelab.attach_table keeps its arguments in an HF config


def _current_dist() -> DistInfo:
    if dist.is_available() and dist.is_initialized():
        return DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size())
    return DistInfo()


def attach_init(model: nn.Module) -> dict | None:
    """``{"seed", "init_std"}`` of the table init :func:`plelab.attach` recorded in the model's config, or None."""
    config = getattr(getattr(model, "module", model), "config", None)
    saved = getattr(config, ATTACH_CONFIG_KEY, None) if config is not None else None
    if not isinstance(saved, dict) or "seed" not in saved or "init_std" not in saved:
        return None
    return {"seed": int(saved["seed"]), "init_std": float(saved["init_std"])}


def regenerated_table(shape: tuple[int, int], seed: int, init_std: float, dtype: torch.dtype = torch.float32):
    """The table :func:`plelab.attach` initialised: normal(0, init_std) from ``seed``, drawn first, rounded to
    ``dtype`` as attach stored it; returned as float32 ``[Vp, L·dP]``."""
    g = torch.Generator().manual_seed(seed)
    return torch.empty(tuple(shape)).normal_(0.0, init_std, generator=g).to(dtype).float()


def regenerated_w0(model: nn.Module) -> torch.Tensor | None:
    """The table at step 0 from the seed :func:`plelab.attach` recorded, or None where it recorded none."""
    init = attach_init(model)
    if init is None:
        return None
    table = PLEModules(model).table
    return regenerated_table(tuple(table.shape), init["seed"], init["init_std"], table.dtype)


def regenerated_aux_w0(model: nn.Module, module: nn.Module) -> torch.Tensor | None:
    """The values :func:`plelab.attach_table` gave ``module``'s table at step 0 (``[rows, layers·dim]`` float32, in
    the dtype it was stored in), from the seed it recorded in the model's config; None where it recorded none."""
    config = getattr(getattr(model, "module", model), "config", None)
    saved = getattr(config, TABLE_CONFIG_KEY, None) if config is not None else None
    if not isinstance(saved, dict) or not {"seed", "init_std", "init"} <= set(saved):
        return None
    weight = module.embed.weight
    fresh = module.blank()  # attach_table drew the init in float32 on the CPU
    fresh.reset_parameters(generator=torch.Generator().manual_seed(int(saved["seed"])),
                           std=float(saved["init_std"]), init=str(saved["init"]))
    return fresh.embed.weight.detach().to(weight.dtype).float()


class _Table:
    """The table a :class:`Monitor` watches: PLE's (``ple`` set) or one aux module's (``module`` set): its ``kind``,
    state-dict ``key``, ``weight [rows, layers·dim]``, ``layers``, ``dim``, the module whose lookups are counted
    (``counted``) and the trunk's hidden size."""

    def __init__(self, model: nn.Module) -> None:
        found = aux_modules(getattr(model, "module", model))
        if len(found) > 1:
            raise PlelabError(f"plelab.Monitor watches one table; the model holds {len(found)} "
                              f"({', '.join(found)}): monitor a model with one")
        self.ple, self.module = None, None
        if found:
            self.module = next(iter(found.values()))
            self.kind = next(k for k, cls in AUX_CLASSES.items() if isinstance(self.module, cls))
            self.key = aux_table_key(self.kind)
            self.weight, self.layers, self.dim = model_table(self.module)
            self.counted = self.module.embed  # one lookup per forward, of token ids or [B,T,S] hash buckets
            config = getattr(getattr(model, "module", model), "config", None)
            config = getattr(config, "text_config", None) or config
            hidden = getattr(config, "hidden_size", None)
            self.hidden_size = hidden if isinstance(hidden, int) and not isinstance(hidden, bool) else None
            return
        try:
            self.ple = PLEModules(model)
        except LookupError as err:
            raise PlelabError(f"plelab.Monitor needs a model with a token-indexed table ({err}); add one with "
                              "plelab.attach(model, dim) or plelab.attach_table(model, kind), build a plelab model "
                              "with ple.dim > 0 or aux.kind set, or hold plelab.PerLayerEmbedding / PerLayerInjection "
                              "(or ValueEmbeddings, HashedNgramEmbedding, TokenModulation) modules in your own"
                              ) from None
        self.kind, self.key, self.counted = "ple", TABLE_KEY, self.ple.embedding
        self.weight, self.layers, self.dim = self.ple.table, self.ple.num_layers, self.ple.dim
        self.hidden_size = int(self.ple.embedding.owner.per_layer_model_projection.weight.shape[1])

    @property
    def training(self) -> bool:
        return (self.ple.embedding.owner if self.ple is not None else self.module).training


class Monitor:
    """Live and at-checkpoint diagnostics of the token-indexed table in ``model`` (plelab's, an HF model after
    ``attach`` or ``attach_table``, or your own decoder holding :class:`~plelab.PerLayerEmbedding` /
    :class:`~plelab.PerLayerInjection`, or one of the family's other modules, under any attribute names: they are
    found by type), written under ``out``.

    ``every``: signal metrics every this many steps (0: never); ``checkpoint_every``: structure + use diagnostics
    every this many steps (0: only when :meth:`checkpoint` is called); ``val_windows [N, T+1]``: token windows for
    the use test (None: no use test); ``w0``: ``"auto"`` (regenerate if plelab initialised the table, else snapshot)
    or ``"snapshot"``; ``seed``: the use test's permutation seed; ``total_steps``: the run's planned length, which
    places each checkpoint on the verdict's calibrated decision points (None: unknown, the verdict then uses the
    end-of-run thresholds and says the model is outside the calibrated range); ``logits_of``: for the use test,
    a function from the output of ``model(ids [B,T])`` to its logits ``[B,T,V]`` — needed when the forward returns
    neither an object with ``.logits`` nor the logits tensor itself (e.g. ``lambda out: out[0]`` for a
    ``(logits, loss)`` tuple). A forward hook counts the looked-up rows: PLE's from its embedding's ``table_ids``,
    another kind's from its ``embed`` lookup (token ids, or the n-gram table's hash buckets).
    """

    def __init__(self, model: nn.Module, out: str | Path, *, every: int = 50, checkpoint_every: int = 0,
                 val_windows: torch.Tensor | None = None, w0: str = "auto", seed: int = 0,
                 total_steps: int | None = None, logits_of: Callable | None = None) -> None:
        self.table = _Table(model)
        if logits_of is not None and not callable(logits_of):
            raise PlelabError(f"Monitor logits_of must be a function from the model's output to its logits, got "
                              f"{type(logits_of).__name__}")
        for name, value in (("every", every), ("checkpoint_every", checkpoint_every)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PlelabError(f"Monitor {name} must be an integer >= 0, got {value!r}")
        if total_steps is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, int)
                                        or total_steps < 1):
            raise PlelabError(f"Monitor total_steps must be an integer >= 1 or None, got {total_steps!r}")
        if w0 not in ("auto", "snapshot"):
            raise PlelabError(f"Monitor w0 must be 'auto' or 'snapshot', got {w0!r}")
        if val_windows is not None and (not isinstance(val_windows, torch.Tensor) or val_windows.ndim != 2
                                        or val_windows.shape[1] < 2 or val_windows.is_floating_point()):
            raise PlelabError("Monitor val_windows must be an integer tensor [N, T+1] of token ids (T >= 1)")
        self.model, self.out = model, Path(out)
        self.every, self.checkpoint_every, self.val_windows, self.seed = every, checkpoint_every, val_windows, seed
        self.total_steps, self.logits_of = total_steps, logits_of
        self.dist = _current_dist()
        t = self.table
        table = t.weight
        self.rows = RowCounter(table.shape[0], table.device)
        self.probe: SignalProbe | None = None
        hook = self._count if t.ple is not None else self._count_lookup
        self._handles = [t.counted.register_forward_hook(hook, with_kwargs=True)]
        self.completed, self.last_checkpoint, self.latest = 0, None, {}
        w0_values, self.w0_init = None, None  # w0_values: written to w0.safetensors; w0_init: regenerated instead
        if t.ple is not None:
            self.w0_init = None if w0 == "snapshot" else attach_init(model)
            self.w0_source = "regenerated from the attach seed"
        elif w0 != "snapshot":  # written to disk: diagnose rebuilds no aux module from a monitor folder
            w0_values = regenerated_aux_w0(model, t.module)
            self.w0_source = "regenerated from the attach_table seed (written to disk)"
        if w0_values is None and self.w0_init is None:
            w0_values = table.detach()
            self.w0_source = f"snapshot at construction ({table.numel() * 4:,} bytes on disk)"
        if self.dist.is_main:
            try:
                if w0_values is not None:
                    snapshot = {t.key: w0_values.float().cpu().contiguous()}
                    atomic_write(self.out / W0_FILE, lambda p: save_file(snapshot, str(p)))
                write_json(self.out / "monitor.json", {"kind": t.kind, "table_key": t.key, "shape": [
                           table.shape[0], t.layers, t.dim], "w0": self.w0_source, "w0_init": self.w0_init,
                           "table_dtype": str(table.dtype).removeprefix("torch."), "every": every,
                           "checkpoint_every": checkpoint_every, "seed": seed, "total_steps": total_steps,
                           "hidden_size": t.hidden_size})
            except OSError as err:
                raise PlelabError(f"plelab.Monitor cannot write to {self.out}: {os_reason(err)}; give a writable "
                                  "folder") from None
        self._arm(0)

    def _count(self, embedding, args, kwargs, _out) -> None:
        table_ids = args[1] if len(args) > 1 else kwargs.get("table_ids")
        if embedding.owner.training and torch.is_grad_enabled():
            self.rows.update(table_ids)

    def _count_lookup(self, embed, args, kwargs, _out) -> None:
        if self.table.training and torch.is_grad_enabled():
            self.rows.update(args[0] if args else kwargs.get("input"))

    def _due(self, step: int) -> bool:
        return bool(self.every) and (step + 1) % self.every == 0

    def _arm(self, step: int) -> None:
        if self._due(step) and self.probe is None and self.table.ple is not None:
            self.probe = SignalProbe(self.model).__enter__()

    def step(self, step: int) -> dict:
        """Call after the backward of training step ``step`` (0-based), before the gradients are zeroed. Returns the
        row written to ``metrics.jsonl`` ({} on steps without diagnostics)."""
        row: dict = {}
        probe, self.probe = self.probe, None
        if probe is not None:
            probe.__exit__(None, None, None)
        if self._due(step) and (probe is not None or self.table.ple is None):
            diag = ({**probe.summary(), **gradient_norms(self.model)} if probe is not None
                    else {"table_grad_norm": table_gradient_norm(self.table.weight)})
            diag["rows_touched"] = self.rows.fraction_touched(self.dist)
            row = {"step": step + 1, "diag": diag}
            self.latest = diag
            if self.dist.is_main:
                with naming(self.out / "metrics.jsonl"), (self.out / "metrics.jsonl").open("a") as f:
                    f.write(json.dumps(row) + "\n")
        self.completed = step + 1
        if self.checkpoint_every and (step + 1) % self.checkpoint_every == 0:
            self.checkpoint(step + 1)
        self._arm(step + 1)
        return row

    def log(self, step: int, values: dict) -> None:
        """Append ``{"step": step, **values}`` (the host loop's numbers: loss, learning rate, …; ``step`` completed
        steps) to ``metrics.jsonl`` (rank 0; non-numeric values are left out)."""
        row = {k: float(v) for k, v in values.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}
        if row and self.dist.is_main:
            with naming(self.out / "metrics.jsonl"), (self.out / "metrics.jsonl").open("a") as f:
                f.write(json.dumps({"step": int(step), **row}) + "\n")

    def scalars(self, prefix: str = "plelab/") -> dict[str, float]:
        """The latest signal diagnostics as flat numbers for a logger: each per-layer metric's mean over the layers
        that have it, named ``{prefix}{metric}``, and the share of rows touched."""
        out = {}
        for name, value in self.latest.items():
            values = value if isinstance(value, list) else [value]
            xs = [float(x) for x in values if isinstance(x, (int, float)) and not isinstance(x, bool)]
            if xs:
                out[prefix + name] = sum(xs) / len(xs)
        return out

    def check_optimizer(self, optimizer) -> float:
        """The weight decay ``optimizer`` applies to the table (0.0 when none); warns when it is > 0: the Monitor's
        Δ = W_t − W_0 then counts the decay's shrink as learning (give the table a group with weight_decay=0, e.g.
        ``plelab.param_groups``)."""
        table = self.table.weight
        decay = max((float(g.get("weight_decay", 0.0)) for g in getattr(optimizer, "param_groups", [])
                     if any(p is table for p in g["params"])), default=0.0)
        if decay > 0:
            name = "PLE" if self.table.kind == "ple" else self.table.kind
            warnings.warn(f"plelab.Monitor: the optimizer decays the {name} table (weight_decay={decay:g}); "
                          "Δ = W_t − W_0 then reads the decay's shrink as learning — give the table weight_decay=0 "
                          "(plelab.param_groups does), "
                          "e.g. Trainer(optimizers=(plelab.adamw(plelab.param_groups(model, lr)), None))",
                          stacklevel=2)
        return decay

    def state_dict(self) -> dict:
        """What a resume needs: completed steps, the last checkpointed step and this rank's row counts."""
        return {"step": self.completed, "last_checkpoint": self.last_checkpoint,
                "row_counts": self.rows.counts.detach().cpu().clone()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`: the row counts go on from where they were, never from 0."""
        counts = state.get("row_counts")
        if not isinstance(counts, torch.Tensor) or counts.shape != self.rows.counts.shape:
            got = tuple(counts.shape) if isinstance(counts, torch.Tensor) else type(counts).__name__
            raise PlelabError(f"the saved Monitor state holds row counts {got}, this table has "
                              f"{tuple(self.rows.counts.shape)} rows: it belongs to another model")
        with torch.no_grad():
            self.rows.counts.copy_(counts.to(self.rows.counts.device, self.rows.counts.dtype))
        self.completed = int(state.get("step", 0))
        last = state.get("last_checkpoint")
        self.last_checkpoint = None if last is None else int(last)
        self._arm(self.completed)

    def finish(self, step: int | None = None) -> dict | None:
        """The final verdict and the end: a checkpoint at ``step`` (default the completed steps) unless one was just
        written there, then :meth:`close`. Returns that checkpoint's diagnostics (None if none was written)."""
        step = self.completed if step is None else int(step)
        diags = self.checkpoint(step) if step > 0 and step != self.last_checkpoint else None
        self.close()
        return diags

    def w0(self) -> torch.Tensor:
        """The table at step 0, ``[Vp, L·dP]`` float32 (memory-mapped when it is the snapshot)."""
        if self.w0_init is None:
            return mmap_tensor(self.out / W0_FILE, self.table.key)
        return regenerated_w0(self.model)

    def checkpoint(self, step: int, val_windows: torch.Tensor | None = None) -> dict | None:
        """Write ``checkpoints/step-{step:06d}/`` (diagnostics.json, ple_table.safetensors) and return the diagnostics
        (rank 0; other ranks take part in the row-count sum and return None). ``val_windows``: this call's use-test
        windows instead of the monitor's own."""
        counts = sum_across_ranks(self.rows.counts, self.dist).cpu()  # a collective: every rank calls it
        self.last_checkpoint = step
        if not self.dist.is_main:
            return None
        folder = self.out / "checkpoints" / f"step-{step:06d}"
        model = getattr(self.model, "module", self.model)  # the use test runs on rank 0 alone: not through DDP
        device = self.table.weight.device
        diags = {"step": step, "w0": self.w0_source,
                 **table_diagnostics(model, self.w0(), counts.numpy().astype(np.float64), 1.0,
                                     self.val_windows if val_windows is None else val_windows, device, seed=self.seed,
                                     fraction=step / self.total_steps if self.total_steps else None,
                                     logits_of=self.logits_of)}
        tensors = {self.table.key: self.table.weight.detach().float().cpu().contiguous(), COUNTS_KEY: counts.cpu()}
        atomic_write(folder / TABLE_FILE, lambda p: save_file(tensors, str(p)))
        write_json(folder / "diagnostics.json", diags)
        return diags

    def close(self) -> None:
        """Remove every hook this monitor put on the model."""
        if self.probe is not None:
            self.probe.__exit__(None, None, None)
            self.probe = None
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
