"""``plelab diagnose``: structure, use and verdict for a per-layer table.

For a plelab run or checkpoint everything is available: W_t (the checkpoint), W_0 (regenerated
exactly from the run's seed), how often each row was looked up (the sampler replayed), the
model and the validation split (for the use test). For a bare safetensors file only the W_t
metrics and their nulls can be computed, and the report says so.

Only the whole-table calls are calibrated: each layer's are printed UNCALIBRATED with their statistics
(:func:`plelab.diagnostics.verdict.layer_verdict`). The reliability lines quote the benchmark's error rates counted
by configuration, held out by corpus (or the worst scheme, named), with coverage — or say why the model is outside
the calibrated range (:func:`plelab.diagnostics.verdict.range_status`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from tqdm.auto import tqdm

from plelab.config.schema import RunConfig
from plelab.data.mixture import train_sampler
from plelab.data.pipeline import prepare_token_data
from plelab.data.tokens import TokenData, data_val_windows, val_windows
from plelab.diagnostics.agreement import cka_against_null, comparable
from plelab.diagnostics.foreign import ForeignUse, foreign_report, hf_config
from plelab.diagnostics.live import initial_table
from plelab.diagnostics.monitor import COUNTS_KEY, TABLE_FILE, W0_FILE, regenerated_table
from plelab.diagnostics.predictive import id_information
from plelab.diagnostics.reference import checked
from plelab.diagnostics.structure import (
    StreamingMoments,
    gaussian_null,
    linear_cka,
    matrix_stats,
    mp_erank_ratio,
    mp_pc1,
)
from plelab.diagnostics.tables import TableSource, find_table
from plelab.diagnostics.usage import use_metrics
from plelab.diagnostics.verdict import calibrated_windows, layer_verdict, verdict, verdict_reliability
from plelab.errors import PlelabError
from plelab.model.init import build_model
from plelab.model.loading import mmap_tensor
from plelab.model.ple import TABLE_KEY
from plelab.model.tables import model_table
from plelab.training.checkpoint import load_model_weights, read_state
from plelab.training.hosts import get_host, host_logits
from plelab.training.optim import lr_multiplier, table_lr
from plelab.training.rows import null_ids, row_counts, rows_of, token_rows


def row_occurrences(cfg: RunConfig, data: TokenData, steps: int) -> np.ndarray:
    """How many times each table row was looked up in ``steps`` training steps (sampler replayed).

    For ``ple.ids='iid'`` the draws are random: the expected counts are returned.
    """
    tc, vp = cfg.train, cfg.ple.resolved_vocab_size(cfg.model)
    if cfg.ple.ids == "iid":
        rows = row_counts(cfg, data)
        return rows / max(1, rows.sum()) * steps * tc.batch_size * tc.seq_len
    sampler = train_sampler(data, tc.seq_len, cfg.seed)
    counts = np.zeros(max(vp, cfg.model.vocab_size), dtype=np.int64)
    for step in range(steps):
        x, _ = sampler.batch(step, tc.batch_size)
        counts += np.bincount(x.reshape(-1).numpy(), minlength=len(counts))
    return rows_of(counts, token_rows(cfg, data), vp).astype(np.float64)


def weight_decay_shrink(cfg: RunConfig, steps: int) -> float:
    """α = Π_s (1 − lr_s·wd) of the table group: the part of W_t that is the decayed W_0."""
    tc = cfg.train
    lr = table_lr(tc)
    return math.prod(1 - lr * lr_multiplier(s, tc) * tc.table_weight_decay for s in range(steps))


def _saved_counts(ckpt: Path) -> np.ndarray | None:
    """The exact row counts a trainer saved with the checkpoint (``diag.row_counts``), if any."""
    try:
        with safe_open(str(ckpt / "optimizer.safetensors"), framework="pt") as f:
            if "diag.row_counts" in f.keys():
                return f.get_tensor("diag.row_counts").numpy().astype(np.float64)
    except Exception:  # a missing or foreign optimizer file: fall back to replaying the sampler
        return None
    return None


class RunTable:
    """A plelab run's table with everything needed around it (computed once, shared by comparisons)."""

    def __init__(self, source: TableSource, data: TokenData | None = None) -> None:
        if source.config is None:
            raise PlelabError(f"{source.file} is not a plelab run: --reference and --null take plelab runs or "
                              "folders plelab.Monitor wrote")
        self.source, self.cfg, self.step = source, source.config, source.step
        self.data = data or prepare_token_data(self.cfg, progress=False)
        state = read_state(source.checkpoint, for_resume=False)
        saved = state.get("corpus_fingerprint")
        if saved is not None and saved != self.data.corpus_fingerprint:
            raise PlelabError(f"{source.checkpoint} was trained on another corpus than its config now gives "
                              f"(sha256 {saved[:12]}…, now {self.data.corpus_fingerprint[:12]}…); restore its data")
        self.table = source.load()
        self.alpha = state.get("table_decay_alpha")
        self.counts = _saved_counts(source.checkpoint)
        if self.counts is None and self.cfg.aux.extra:
            raise PlelabError(f"{source.checkpoint} holds no row counts (diag.row_counts), which every checkpoint of "
                              f"an aux.kind={self.cfg.aux.kind} run has: the checkpoint is damaged; use another")
        if self.counts is None:
            self.counts = row_occurrences(self.cfg, self.data, self.step)
        w0 = initial_table(self.cfg).view(self.table.shape)
        alpha = self.alpha if self.alpha is not None else weight_decay_shrink(self.cfg, self.step)
        self.delta = self.table - alpha * w0


class MonitoredTable:
    """A checkpoint a :class:`Monitor` wrote, read back for ``plelab diagnose``: the table ``[Vp, L, dP]``, its row
    counts, Δ = W_t − W_0 and the use test the monitor ran (``saved_use``; None when it had no windows)."""

    cfg = None  # not a plelab run: nothing to rebuild the model or its data from

    def __init__(self, source) -> None:
        monitor, ckpt = source.monitor, source.checkpoint
        self.source, self.step = source, source.step
        self.table = source.load()
        try:
            with safe_open(str(ckpt / TABLE_FILE), framework="pt") as f:
                self.counts = f.get_tensor(COUNTS_KEY).numpy().astype(np.float64)
            saved = json.loads((ckpt / "diagnostics.json").read_text())
        except (OSError, ValueError, SafetensorError) as err:
            raise PlelabError(f"{ckpt} is not a complete monitor checkpoint ({err}); it is written by "
                              "plelab.Monitor.checkpoint") from None
        init = monitor.get("w0_init")
        if init:
            dtype = getattr(torch, str(monitor.get("table_dtype", "float32")), torch.float32)
            w0 = regenerated_table((source.rows, source.num_layers * source.dim), int(init["seed"]),
                                   float(init["init_std"]), dtype)
        else:
            w0 = mmap_tensor(source.run_dir / W0_FILE, str(monitor.get("table_key", TABLE_KEY)))
        self.delta = self.table - w0.float().view(self.table.shape)
        self.saved_use, self.saved_val_loss = saved.get("use"), saved.get("val_loss")
        self.total_steps, self.hidden_size = monitor.get("total_steps"), monitor.get("hidden_size")


def table_of(source: TableSource) -> RunTable | MonitoredTable:
    """What diagnose compares: a plelab run's table, or a checkpoint a Monitor wrote."""
    return MonitoredTable(source) if source.monitor is not None else RunTable(source)


def _monitored_use(run: MonitoredTable, report: dict) -> dict | None:
    """The table-level use test a Monitor ran at this checkpoint (it holds the model and the windows)."""
    if run.saved_use is None:
        report["notes"].append("the Monitor was given no val_windows: no use test at this checkpoint")
        return None
    report["base_val_loss"] = run.saved_val_loss
    report["notes"].append(f"use test: run by plelab.Monitor at step {run.step} on the validation windows it was "
                           "given (whole table; no per-layer use)")
    return run.saved_use


def _wt_stats_streamed(source: TableSource, progress: bool) -> list[StreamingMoments]:
    accs = [StreamingMoments(source.rows, source.dim) for _ in range(source.num_layers)]
    bar = tqdm(total=source.rows, desc="reading table", unit="rows", disable=not progress, leave=False)
    for _, chunk in source.chunks():
        for layer, acc in enumerate(accs):
            acc.update(chunk[:, layer])
        bar.update(len(chunk))
    bar.close()
    return accs


def _compared(report: dict, other: TableSource, what: str) -> TableSource:
    """Record in ``report`` which table was compared as ``what`` (its file, checkpoint and step); returns it."""
    report["compared_with"][what] = {"table_file": str(other.file), "step": other.step,
                                     "checkpoint": str(other.checkpoint) if other.checkpoint is not None else None}
    return other


def diagnose_run(path: str | Path, reference: str | Path | None = None, null_run: str | Path | None = None,
             use: bool = True, num_layers: int | None = None, dp: int | None = None, windows: int | None = None,
             progress: bool = True, null_reference: str | Path | None = None, init: str | Path | None = None,
             reference_init: str | Path | None = None, foreign_use: ForeignUse | None = None,
             allow_mismatch: bool = False) -> dict:
    """Everything ``plelab diagnose`` reports, as a JSON-ready dict.

    ``reference`` / ``null_run`` / ``null_reference`` are read at this checkpoint's step (or the nearest, noted) and
    refused when their run differs from this one in model, table shape, precision or corpus (a reference also in
    sharing the seed), unless ``allow_mismatch``: then the differences are in the notes
    (:mod:`plelab.diagnostics.reference`). ``init``, ``reference_init`` and ``foreign_use`` are for a checkpoint
    plelab did not train (:mod:`plelab.diagnostics.foreign`); :func:`plelab.diagnose` builds ``foreign_use`` from
    ``data=`` and ``tokenizer=``.
    """
    windows = calibrated_windows() if windows is None else windows
    if windows < 1:
        raise PlelabError(f"--windows must be >= 1, got {windows}")
    if null_reference is not None and (null_run is None or reference is None):
        raise PlelabError("--null-reference needs --null (the null run) and --reference (this run's second seed)")
    if allow_mismatch and reference is None and null_run is None:
        raise PlelabError("--allow-mismatch lets a --reference or --null of another configuration be compared; "
                          "give one, or drop it")
    source = find_table(path, num_layers, dp)
    foreign = source.config is None and source.monitor is None
    if foreign and null_run is not None:
        raise PlelabError(f"--null compares with a matched null run's Δ and row counts, which {path} does not have "
                          "(a bare or HF table); give plelab runs or folders plelab.Monitor wrote, or drop --null")
    if not foreign and (init is not None or reference_init is not None):
        raise PlelabError(f"--init/--reference-init are for checkpoints plelab did not train: {path} has its W_0 "
                          "already (regenerated from its seed, or the Monitor's); drop them")
    if not foreign and foreign_use is not None:
        raise PlelabError(f"{path} is a plelab run or Monitor folder: its use test reads the run's own validation "
                          "data and model; drop --data/--tokenizer")
    if foreign and reference is None and (reference_init is not None or (init is not None and foreign_use is None)):
        raise PlelabError("--init/--reference-init give W_0 for a cross-seed comparison (add --reference OTHER) or, "
                          "--init alone, for the reset test (add --data and --tokenizer); or drop them")
    L, dP = source.num_layers, source.dim
    report: dict = {"source": str(path), "table_file": str(source.file), "key": source.key, "step": source.step,
                    "run_dir": str(source.run_dir) if source.run_dir is not None else None,
                    "shape": [source.rows, L, dP], "notes": [], "layers": [], "compared_with": {}}
    table_mode = source.config.ple.table if source.config is not None else "learned"
    if table_mode != "learned":
        report["notes"].append(f"ple.table={table_mode}: the table was not trained (Δ = 0): two such tables agree "
                               "only as their null does (z = 0)" + ("; the use test asks whether the model relies on "
                               "its random rows" if table_mode == "frozen" else "; there is nothing to use"))
        null_run = null_reference = None
        use = use and table_mode == "frozen"
    others: dict[str, TableSource] = {}  # checked before anything is computed (the null's second seed: vs the null)
    for what, other, second in (("--reference", reference, True), ("--null", null_run, False),
                                ("--null-reference", null_reference, True)):
        if other is not None:
            like = others["--null"] if what == "--null-reference" else source
            others[what] = _compared(report, checked(other, like, what, allow_mismatch, report["notes"], second), what)
    accs = _wt_stats_streamed(source, progress)
    null_all = gaussian_null(source.rows, dP, seed=1)
    mp = {"erank_ratio": mp_erank_ratio(source.rows, dP), "pc1": mp_pc1(source.rows, dP)}
    layers = [{"layer": i, "wt_all": acc.finalize().to_dict(), "null_all": null_all.to_dict(), "mp_all": mp}
              for i, acc in enumerate(accs)]
    report["layers"] = layers
    if foreign:
        if reference is None and foreign_use is None:
            report["notes"].append("W_t-only report: no second seed, W_0, row counts or model were given, so neither "
                                   "STRUCTURE nor USE can be decided (a Gaussian table already has erank ≈ d and "
                                   "mean cos ≈ 0): add --reference, and --data with --tokenizer")
        report = foreign_report(report, source, reference, init, reference_init, foreign_use)
        hidden = hf_config(source).get("hidden_size")  # the range check's H, where config.json gives it
        report["reliability"] = verdict_reliability(hidden if isinstance(hidden, int) else None, source.rows, dP, None,
                                                    None, layers=L, trunk="a foreign checkpoint")
        return report

    run = table_of(source)
    ref, nul, nul_ref = (table_of(others[w]) if w in others else None
                         for w in ("--reference", "--null", "--null-reference"))
    used = run.counts > 0
    if not used.any():
        raise PlelabError(f"{source.checkpoint} has no table row looked up yet (step {source.step}); train further")
    both = used & (ref.counts > 0) if ref is not None else used
    occ = run.counts[used]
    report["rows"] = {"total": source.rows, "used": int(used.sum()), "fraction_used": float(used.mean()),
                      "occurrences_per_used_row": {
                          "median": float(np.median(occ)), "p10": float(np.percentile(occ, 10)),
                          "p90": float(np.percentile(occ, 90)), "max": float(occ.max())}}
    edges = [1, 10, 100, 1000, 10_000, math.inf]
    norms = run.delta.flatten(1).norm(dim=1).numpy()
    report["rows"]["delta_by_occurrence"] = [
        {"occurrences": f"{lo:,}–{hi - 1:,}" if hi != math.inf else f"≥{lo:,}", "rows": int(m.sum()),
         "mean_delta_norm": float(norms[m].mean())}
        for lo, hi in zip(edges, edges[1:]) if (m := (run.counts >= lo) & (run.counts < hi)).any()]
    null_used = gaussian_null(int(used.sum()), dP, seed=2)
    for i, layer in enumerate(layers):
        layer["wt_used"] = matrix_stats(run.table[used, i]).to_dict()
        layer["null_used"] = null_used.to_dict()
        layer["delta_used"] = matrix_stats(run.delta[used, i]).to_dict()
        if ref is not None and ref.delta.shape == run.delta.shape:  # per layer: only between equal layouts
            layer.update(cross_seed=cka_against_null(run.delta[both, i], ref.delta[both, i], run.counts[both]))
        if nul is not None and nul.delta.shape == run.delta.shape:
            layer["null_run_delta_used"] = matrix_stats(nul.delta[nul.counts > 0, i]).to_dict()
    table_cka = (cka_against_null(run.delta[both].flatten(1), ref.delta[both].flatten(1), run.counts[both])
                 if ref is not None else None)
    null_run_cka = None
    if nul_ref is not None:
        nboth = (nul.counts > 0) & (nul_ref.counts > 0)
        null_run_cka = linear_cka(comparable(nul.delta[nboth].flatten(1), nul.counts[nboth]),
                                  comparable(nul_ref.delta[nboth].flatten(1), nul.counts[nboth]))
        report["null_run_cka"] = null_run_cka
    use_table: dict | None = None
    use_layers: dict[int, dict] = {}
    if use and run.cfg is None:
        use_table = _monitored_use(run, report)
    elif use:
        host = get_host(run.cfg)  # None: plelab's decoder
        model = (build_model(run.cfg.model, run.cfg.ple, seed=run.cfg.seed, ac=run.cfg.aux) if host is None
                 else host.build(run.cfg, "cpu"))
        load_model_weights(model, source.checkpoint)
        iid = null_ids(run.cfg, run.data)
        win = data_val_windows(run.data, run.cfg.train.seq_len, windows)
        base, results = use_metrics(model, win, initial_table(run.cfg), run.counts, batch=16,
                                    device=torch.device("cpu"), per_layer=True, seed=run.cfg.seed, iid=iid,
                                    table=model_table(model), logits_of=None if host is None else host_logits)
        report["base_val_loss"] = base
        train_win = val_windows(run.data.train, run.cfg.train.seq_len, 4 * windows)
        if host is None and not run.cfg.aux.extra:  # the probe reads plelab's decoder's hidden states and PLE table
            report["predictiveness"] = id_information(model, train_win, win, seed=run.cfg.seed, iid=iid)
        use_table = {r.kind: r.to_dict() for r in results if r.layer is None}
        for r in results:
            if r.layer is not None:
                use_layers.setdefault(r.layer, {})[r.kind] = r.to_dict()
    cfg = run.cfg
    total = cfg.train.steps if cfg is not None else run.total_steps
    fraction = source.step / total if total and source.step is not None else None
    for i, layer in enumerate(layers):
        cs = layer.get("cross_seed", {})
        perm = use_layers.get(i, {}).get("permute")
        layer["use"] = use_layers.get(i)
        layer["verdict"] = layer_verdict(cs.get("cka"), cs.get("null_mean"), cs.get("null_sd"),
                                         delta=perm and perm["delta"], se=perm and perm["se"], layers=L).to_dict()
    perm = (use_table or {}).get("permute")
    reset = (use_table or {}).get("reset")
    extra = [f"reset-to-init costs {reset['delta']:+.4f}±{reset['se']:.4f} nats"] if reset else []
    report["table"] = {"cross_seed": table_cka, "use": use_table,
                       "verdict": verdict(table_cka and table_cka["cka"], table_cka and table_cka["null_mean"],
                                          table_cka and table_cka["null_sd"], null_run_cka,
                                          delta=perm and perm["delta"], se=perm and perm["se"],
                                          extra=extra, fraction=fraction).to_dict()}
    report["reliability"] = verdict_reliability(cfg.model.hidden_size if cfg is not None else run.hidden_size,
                                                source.rows, dP, fraction, float(run.counts.sum()) / source.rows,
                                                windows=perm and perm.get("windows"), layers=L,
                                                trunk=_trunk(cfg), kind=_table_kind(cfg, source))
    return report


def _table_kind(cfg, source: TableSource) -> str:
    """The table's kind: the run's ``aux.kind``, the one a Monitor recorded, else PLE (a bare or HF table)."""
    if cfg is not None:
        return cfg.aux.kind
    return str(source.monitor.get("kind", "ple")) if source.monitor is not None else "ple"


def _trunk(cfg: RunConfig | None) -> str:
    """The trunk a run's table sits in, for the range check (a monitored run's is the user's model)."""
    if cfg is None:
        return "a monitored model (attach or your own decoder)"
    return {"plelab": "plelab", "hf": f"the HF trunk {cfg.model.hf_config}",
            "factory": f"your model {cfg.model.factory}"}[cfg.model.host]
