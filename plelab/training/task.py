"""The seams of the trainer: a :class:`Task` says what a kind of run is, :class:`Observer` s watch it.

The trainer (:mod:`plelab.training.trainer`) owns the loop, checkpoints, resume, metrics and the NaN diagnosis;
a task owns everything else — the model and its parameter groups, the data, the loss, evaluation, its own
state. One step, as the trainer runs it:

    bound = task.bind(env)                                  # once: device, process group, micro-batch
    batches = [task.batch(step, m, rows_m) for m in range(grad_accum)]   # fixed for the step
    for each batch: loss = task.loss(forward, batch); (loss / grad_accum).backward()
    ... finite? count batch.rows, observers' after_backward, clip, optimizer step
    task.after_step(step)                                   # e.g. the online quantizer's own update

``batch`` is pure over the data (same arguments, same tokens): inputs that depend on state — the i.i.d. null
control's draws, the IDs of an online quantizer as it is now — are computed when the batch is made and stored
in it, so the NaN replay (``task.loss`` on the stored batches) sees exactly what the step saw.

Kinds of run are :class:`Kind` records registered by name (:func:`register_task_kind`); a package above ``train``
registers its own (``plelab.visual`` registers ``visual``) and is imported only when a config's ``kind`` names it,
so the trainer never imports what builds on it.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from plelab.config.schema import KIND_MODULES, RunConfig
from plelab.errors import PlelabError
from plelab.model.ple import IIDTableIds


@dataclass(frozen=True)
class RunEnv:
    """Where a run executes: its device, process group (``plelab.distributed.DistInfo``), micro-batch
    (sequences per forward on this rank) and whether forwards run under bf16 autocast."""

    device: torch.device
    dist: object
    micro_batch: int
    bf16: bool = False

    def autocast(self):
        """bf16 autocast on the run's device when the run uses it, else a no-op context."""
        if self.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()


@dataclass
class Batch:
    """One micro-batch of a step. ``inputs``: what :meth:`Task.loss` reads; ``rows``: per table name, the rows it
    looks up (``[B,T]`` ids), counted by the trainer once the step is known to be finite."""

    inputs: dict[str, torch.Tensor | None]
    rows: dict[str, torch.Tensor] = field(default_factory=dict)


class Task:
    """What a kind of run is. Subclasses implement the methods that raise; the rest have neutral defaults."""

    #: sequence positions computed per optimizer step (throughput and ``tokens_seen``)
    tokens_per_step: int
    #: table name -> (rows, checkpoint tensor key) of every table whose lookups the trainer counts
    row_tables: dict[str, tuple[int, str]] = {}
    #: True when the task cannot run under torchrun (its state is per process)
    single_process: bool = False
    #: the null control's id frequencies when the text table is keyed by i.i.d. ids (``ple.ids=iid``)
    iid: IIDTableIds | None = None

    def bind(self, env: RunEnv) -> None:
        """Called once by the trainer before anything else: the device, process group and micro-batch."""
        self.env = env

    def build_model(self, table_device: str | None, table_sparse: bool,
                    shard: Callable[[nn.Module], None] | None = None) -> nn.Module:
        """The run's model, initialised. ``shard`` (FSDP2 under torchrun) is applied on the meta device before
        materialisation (``plelab.model.init.build_model``); a task that cannot shard must refuse it."""
        raise NotImplementedError

    def language_model(self, model: nn.Module) -> nn.Module:
        """The text LM (``PLECausalLM``) inside ``model``: the one whose per-layer table the diagnostics read."""
        return model

    def param_groups(self, model: nn.Module) -> list[dict]:
        raise NotImplementedError

    def batch(self, step: int, micro: int, rows: slice) -> Batch:
        raise NotImplementedError

    def loss(self, forward: Callable, batch: Batch) -> torch.Tensor:
        """The mean loss of ``batch`` through ``forward`` (the model, wrapped for DDP / FSDP / compile)."""
        raise NotImplementedError

    def diag_windows(self) -> torch.Tensor | None:
        """Validation windows ``[N, T+1]`` for the at-checkpoint use test of the text table (None: skip it)."""
        return None

    def live_metrics(self, model: nn.Module) -> dict:
        """More live diagnostics of a diagnostics step (after backward, before the optimizer step)."""
        return {}

    def ready(self, step: int) -> None:
        """The run starts (or resumes) at ``step``: after the model is built and any checkpoint restored."""

    def after_step(self, step: int) -> None:
        """The task's own update once step ``step`` has run: after its optimizer update, and also when the step
        is skipped or stopped for a non-finite value (its batches were made from the task's state as it was)."""

    def evaluate(self, model: nn.Module, step: int) -> float:
        """The validation loss (nats) after ``step`` optimizer steps."""
        raise NotImplementedError

    def other_evaluations(self, model: nn.Module, step: int) -> dict[str, float]:
        """More losses for an evaluation row beside ``val_loss`` (e.g. ``ood_loss``: ``data.ood``); {} by default."""
        return {}

    def epochs(self, steps: int) -> float:
        raise NotImplementedError

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """Tensors saved with a checkpoint (``optimizer.safetensors``), given back to :meth:`restore`."""
        return {}

    def checkpoint_state(self) -> dict:
        """JSON state saved with a checkpoint (``state.json``, key ``extra``), given back to :meth:`restore`."""
        return {}

    def restore(self, tensors: dict[str, torch.Tensor], state: dict) -> None:
        """Restore what :meth:`checkpoint_tensors` and :meth:`checkpoint_state` saved."""

    def summary(self, model: nn.Module, step: int, counts: dict[str, torch.Tensor]) -> dict:
        """More fields for ``summary.json`` at the end of the run (``counts``: the row counts per table)."""
        return {}

    def run_files(self) -> dict[str, str]:
        """Text files the run folder holds next to ``config.json`` (name -> contents), e.g. the tokenizer."""
        return {}


class Observer:
    """Watches a run. The trainer calls these in order; every method is optional.

    ``bind(model, env)`` once, when the model is built;
    ``forward_context(step, micro)`` wraps one micro-batch's forward (attach hooks there);
    ``after_backward(step, rows)`` returns metrics for the step's row (gradients are final, nothing updated yet;
    ``rows``: the trainer's row counters per table, this step included);
    ``on_step(row)`` sees the finished metrics row; ``on_eval(step, loss)`` each validation;
    ``on_checkpoint(step, counts, table_alpha)`` returns a dict saved as the checkpoint's ``diagnostics.json``.
    """

    def bind(self, model: nn.Module, env: RunEnv) -> None:
        pass

    def forward_context(self, step: int, micro: int):
        return contextlib.nullcontext()

    def after_backward(self, step: int, rows: dict) -> dict:
        return {}

    def on_step(self, row: dict) -> None:
        pass

    def on_eval(self, step: int, val_loss: float) -> None:
        pass

    def on_checkpoint(self, step: int, counts: dict[str, torch.Tensor], table_alpha: float) -> dict | None:
        return None


@dataclass(frozen=True)
class Kind:
    """A kind of run, in one record (torchtitan's ``TrainSpec`` is the model): how to read its data, make its task,
    describe its data and fill its caches, and what the rest of plelab may do with it. ``RunConfig.kind`` names it;
    its package registers it (:func:`register_task_kind`) and is imported only when a config asks for it
    (:data:`plelab.config.schema.KIND_MODULES`).

    ``data_key(cfg)``: what its prepared data depend on beyond ``data`` (runs with equal keys share one prepared
    set); ``text_model``: its model is a text LM that eval / generate / export / the scaling fit / the rate probe
    read; ``trains_bpe``: text data without ``data.tokenizer`` train a BPE; ``exportable``: ``plelab export``
    writes it as an HF folder."""

    name: str
    prepare_data: Callable  # (cfg, progress, dist) -> data
    make_task: Callable  # (cfg, data) -> Task
    describe_data: Callable  # (cfg, data) -> str
    warm_caches: Callable  # (cfg) -> None
    data_key: Callable = lambda cfg: None  # (cfg) -> a JSON-able value
    text_model: bool = True
    trains_bpe: bool = True
    exportable: bool = True


TaskKind = Kind  # the name before issue 55's Kind record; kept one release

_KINDS: dict[str, Kind] = {}


def register_task_kind(kind: Kind) -> None:
    _KINDS[kind.name] = kind


def kind_name(cfg: RunConfig) -> str:
    """The kind of run a config asks for (``cfg.kind``)."""
    return cfg.kind


def load_kind(name: str) -> None:
    """Import the package that registers the kind ``name`` (of run, or of the study built on it) unless it is
    registered already; a name no package registers is left to the caller's lookup to refuse."""
    if name not in _KINDS and name in KIND_MODULES:
        importlib.import_module(KIND_MODULES[name])  # the kind's package registers its run kind and its study


def task_kind(cfg: RunConfig) -> Kind:
    """The :class:`Kind` of ``cfg``, its package imported on first use."""
    name = kind_name(cfg)
    load_kind(name)
    if name not in _KINDS:
        raise PlelabError(f"no '{name}' kind of run is registered; import the package that registers it before "
                          "running this config")
    return _KINDS[name]
