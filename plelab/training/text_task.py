"""The text LM run: packed token windows, next-token CE, validation on fixed windows (the default kind).

A batch: ``PackedSampler.batch(step)`` (``MixtureSampler`` for several sources) gives this rank's rows of
the global batch ``[b, T+1]``; the model sees
``window[:, :-1]`` with pre-shifted ``targets = window[:, 1:]`` and the table ids it looks up — the token ids
(ids >= Vp -> 0; their frequency-ranked rows under ``ple.vocab_remap=frequency``) or, for the null control
``ple.ids=iid``, ids drawn i.i.d. from the real ids' frequencies with a generator seeded by
``(seed, step, rank, micro)`` (distinct, resumable draws).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from plelab.config.schema import RunConfig
from plelab.data.mixture import train_sampler
from plelab.data.ood import ood_set
from plelab.data.pipeline import prepare_token_data
from plelab.data.tokens import CHUNK_CHARS, TokenData, data_val_windows
from plelab.model.init import build_model
from plelab.model.losses import window_losses
from plelab.model.ple import IIDTableIds, token_table_ids
from plelab.model.tables import aux_row_ids, table_view
from plelab.runtime import seeded_generator
from plelab.training.hosts import check_host_options, get_host, host_logits
from plelab.training.optim import optimizer_groups
from plelab.training.rows import null_ids, token_rows
from plelab.training.task import Batch, Kind, RunEnv, Task, register_task_kind

TEXT_ROWS_KEY = "diag.row_counts"


class TextTask(Task):
    def __init__(self, cfg: RunConfig, data: TokenData) -> None:
        self.cfg, self.data = cfg, data
        tc = cfg.train
        self.sampler = train_sampler(data, tc.seq_len, cfg.seed)
        self.val = data_val_windows(data, tc.seq_len, tc.eval_batches * tc.batch_size)
        #: data.ood's windows, scored at every evaluation beside the validation split (None: no OOD set)
        self.ood = (ood_set(cfg.data.ood, data.tokenizer_json, tc.seq_len, len(self.val), data.corpus_fingerprint,
                            cfg.data.text_field) if cfg.data.ood else None)
        self.ood_loss: float | None = None
        self.tokens_per_step = tc.batch_size * tc.seq_len
        self.table_rows = cfg.ple.resolved_vocab_size(cfg.model) if cfg.ple.enabled else 0
        view = table_view(cfg.model, cfg.ple, cfg.aux)
        #: the run's table's rows are counted (and its diagnostics read) under "text", whatever its kind
        self.row_tables = {"text": (view.rows, TEXT_ROWS_KEY)} if view is not None else {}
        self.iid: IIDTableIds | None = None
        self.token_rows = token_rows(cfg, data) if self.table_rows else None  # ple.vocab_remap=frequency
        check_host_options(cfg)
        self.host = get_host(cfg)  # None: plelab's decoder
        #: the logits in the model's forward output (a host trunk's; plelab's decoder is scored through its head)
        self.logits_of = host_logits if self.host is not None else None

    def bind(self, env: RunEnv) -> None:
        super().bind(env)
        self.iid = null_ids(self.cfg, self.data, env.device)
        if self.token_rows is not None:
            self.token_rows = self.token_rows.to(env.device)

    def build_model(self, table_device: str | None, table_sparse: bool,
                    shard: Callable[[nn.Module], None] | None = None) -> nn.Module:
        c = self.cfg
        if self.host is not None:  # its options were checked against the host (check_host_options)
            return self.host.build(c, self.env.device)
        return build_model(c.model, c.ple, seed=c.seed, device=self.env.device, table_device=table_device,
                           table_sparse=table_sparse, shard=shard,
                           activation_checkpointing=c.train.activation_checkpointing,
                           token_rows=self.token_rows, ac=c.aux)

    def param_groups(self, model: nn.Module) -> list[dict]:
        return optimizer_groups(model, self.cfg.train)

    def batch(self, step: int, micro: int, rows: slice) -> Batch:
        x, y = self.sampler.batch(step, self.cfg.train.batch_size, rows)
        x = x.to(self.env.device)
        ids = None
        if self.iid is not None:
            gen = seeded_generator(self.cfg.seed, f"iid:{step}:{self.env.dist.rank}:{micro}", self.env.device)
            ids = self.iid.draw(x, gen)
        elif self.token_rows is not None:
            ids = self.token_rows[x]
        elif self.table_rows:
            ids = token_table_ids(x, self.table_rows)
        rows = aux_row_ids(self.cfg.aux, self.cfg.model, x) if ids is None and self.cfg.aux.extra else ids
        if ids is None and self.cfg.aux.kind == "ngram" and self.host is None:
            ids = rows  # the buckets, hashed once: the model looks them up instead of hashing the tokens again
        return Batch({"input_ids": x, "targets": y.to(self.env.device), "table_ids": ids},
                     {"text": rows} if rows is not None else {})

    def loss(self, forward: Callable, batch: Batch) -> torch.Tensor:
        if self.host is not None:  # mean next-token CE on the host's logits, in fp32
            ids = batch.inputs["table_ids"] if self.iid is not None else None
            logits = host_logits(forward(batch.inputs["input_ids"], **({} if ids is None else {"table_ids": ids})))
            return F.cross_entropy(logits.float().flatten(0, 1), batch.inputs["targets"].flatten())
        return forward(batch.inputs["input_ids"], targets=batch.inputs["targets"],
                       table_ids=batch.inputs["table_ids"], return_logits=False).loss

    def evaluate(self, model: nn.Module, step: int) -> float:
        """Mean next-token CE (nats) over the fixed validation windows (every rank runs all of them)."""
        with self.env.autocast():
            return float(window_losses(model, self.val, self.env.micro_batch, self.env.device, self.iid,
                                       self.logits_of).mean())

    def other_evaluations(self, model: nn.Module, step: int) -> dict[str, float]:
        """``ood_loss``: mean next-token CE (nats) over data.ood's windows ({} without data.ood)."""
        if self.ood is None:
            return {}
        with self.env.autocast():
            self.ood_loss = float(window_losses(model, self.ood.windows, self.env.micro_batch, self.env.device,
                                                self.iid, self.logits_of).mean())
        return {"ood_loss": self.ood_loss}

    def summary(self, model: nn.Module, step: int, counts: dict[str, torch.Tensor]) -> dict:
        if self.ood is None:
            return {}
        return {"final_ood_loss": self.ood_loss, "ood": {"corpus": self.ood.name, "fingerprint": self.ood.fingerprint,
                                                         "windows": len(self.ood.windows)}}

    def epochs(self, steps: int) -> float:
        return self.sampler.epochs(steps, self.cfg.train.batch_size)

    def diag_windows(self) -> torch.Tensor | None:
        """Validation windows for the checkpoint use test of the text table (None: skip it)."""
        n = self.cfg.train.diag_windows
        return self.val[:n] if n else None

    def run_files(self) -> dict[str, str]:
        """``tokenizer.json``: the run's ids mean something outside plelab (``tokenizers.Tokenizer.from_file``)."""
        return {"tokenizer.json": self.data.tokenizer_json} if self.data.tokenizer_json else {}


def _describe(cfg: RunConfig, data: TokenData) -> str:
    blocks = f" ({data.n_val_docs:,} of {data.n_train_docs + data.n_val_docs:,} blocks held out)"
    split = (f" (too few documents to split: split as {data.n_pieces:,} pieces of ≤ {CHUNK_CHARS:,} characters)"
             if data.n_pieces else blocks if data.unit == "blocks"
             else " (one shard held out)" if data.unit == "shards" else "")
    mix = ("; mixture " + ", ".join(f"{name} {w:.3f}" for name, _, w in data.mixture) if data.mixture else "")
    return f"{len(data.train):,} train / {len(data.val):,} validation tokens{split}{mix}"


register_task_kind(Kind(
    name="text", prepare_data=prepare_token_data, make_task=TextTask, describe_data=_describe,
    warm_caches=lambda cfg: prepare_token_data(cfg, progress=False)))
