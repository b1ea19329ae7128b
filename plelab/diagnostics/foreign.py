"""The verdict on per-layer tables plelab did not train (HF Gemma 3n / Gemma 4 folders, attached models, exports,
bare safetensors).

STRUCTURE — cross-seed agreement with ``--reference`` (:mod:`plelab.diagnostics.agreement`):

- with ``init`` and ``reference_init`` (step-0 checkpoints of both runs) the compared matrices are
  Δ = W_t − W_0 on the rows either run changed: the cross-seed test of a plelab run; folders saved after
  :func:`plelab.attach` need neither — W_0 is regenerated from the seed and init std their config.json records
  (:func:`attached_w0`);
- without them the matrices are W_t themselves. Two seeds' random inits agree only at the null level, so W_t
  agreement above it is learned — *if* the two checkpoints start from independent initialisations (two fine-tunes
  of one pretrained model agree from step 0), which is why the verdict names its basis.

With data (:class:`ForeignUse`: a model transformers loaded, token windows and counts of the data given) the null
shuffles rows within frequency bins of those counts and frequency is regressed out first, as for a plelab run;
without data it shuffles among all rows and says that frequency is not matched.

USE — the interventions of :mod:`plelab.diagnostics.usage` on the loaded model: rows permuted within frequency
bins of the data's counts, and reset to W_0 when ``init`` gives it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from plelab.diagnostics.agreement import cka_against_null, cka_with_null
from plelab.diagnostics.monitor import ATTACH_CONFIG_KEY, regenerated_table
from plelab.diagnostics.tables import TableSource, find_table
from plelab.diagnostics.usage import use_metrics
from plelab.diagnostics.verdict import UNDECIDED, Verdict, layer_verdict, structure_verdict, verdict
from plelab.errors import PlelabError


@dataclass
class ForeignUse:
    """What the use test of a checkpoint plelab did not train needs; :func:`plelab.diagnose` builds it from
    ``data=`` and ``tokenizer=`` (:mod:`plelab.integrations.checkpoints`)."""

    model: nn.Module  # loaded through transformers, in eval mode
    table: nn.Parameter  # its ``embed_tokens_per_layer.weight`` [Vp, L·dP]
    windows: torch.Tensor  # [N, T+1] token windows of the data
    counts: np.ndarray  # [Vp] how often each table row is looked up in the data (ids >= Vp -> row 0)
    data: str  # what the windows came from, for the report


def _find(path: str, like: TableSource) -> TableSource:
    """A table by its own config; a bare table without one is read with ``like``'s L and dP."""
    try:
        return find_table(path)
    except PlelabError:
        return find_table(path, like.num_layers, like.dim)


def hf_config(source: TableSource) -> dict:
    """The text part of the config.json beside ``source``'s table ({} where there is none or it is unreadable)."""
    try:
        cfg = json.loads((source.file.parent / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    text = cfg.get("text_config") if isinstance(cfg, dict) and isinstance(cfg.get("text_config"), dict) else cfg
    if not isinstance(text, dict):
        return {}
    return {**text, **{k: cfg[k] for k in (ATTACH_CONFIG_KEY, "dtype", "torch_dtype") if k in cfg}}


def attached_w0(source: TableSource) -> torch.Tensor | None:
    """W_0 ``[Vp, L, dP]`` of a table :func:`plelab.attach` initialised, regenerated from the seed and init std its
    folder's config.json records, rounded to the saved dtype as attach stored it (None: not such a folder)."""
    cfg = hf_config(source)
    saved = cfg.get(ATTACH_CONFIG_KEY)
    if not isinstance(saved, dict) or "seed" not in saved or "init_std" not in saved:
        return None
    dtype = getattr(torch, str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32"), torch.float32)
    dtype = dtype if isinstance(dtype, torch.dtype) else torch.float32
    shape = (source.rows, source.num_layers * source.dim)
    return regenerated_table(shape, int(saved["seed"]), float(saved["init_std"]), dtype).view(
        source.rows, source.num_layers, source.dim)


def initial_of(source: TableSource, init: str, what: str) -> torch.Tensor:
    """W_0 ``[Vp, L, dP]`` from a step-0 checkpoint; refused in one line if its table has another shape."""
    w0 = _find(init, source)
    if (w0.rows, w0.num_layers, w0.dim) != (source.rows, source.num_layers, source.dim):
        raise PlelabError(f"{what} {init} has a table of shape {[w0.rows, w0.num_layers, w0.dim]}, the checkpoint "
                          f"{[source.rows, source.num_layers, source.dim]}; give the step-0 checkpoint of this run")
    return w0.load()


def _check_init_pair(init, reference_init) -> None:
    if (init is None) != (reference_init is None):
        raise PlelabError("--init and --reference-init go together: Δ = W_t − W_0 needs the step-0 table of both runs "
                          "(or give neither, for agreement of W_t)")


def foreign_agreement(source: TableSource, reference: str, init: str | None, reference_init: str | None,
                      counts: np.ndarray | None = None, w0: torch.Tensor | None = None) -> dict:
    """Per-layer and whole-table CKA against the null, on Δ (both inits given) or on W_t (neither), with the
    structure verdict and its basis; ``counts [Vp]`` (the data's) make the null frequency-matched; ``w0``: the
    ``init`` table already read (a table of Gemma 3n's size is gigabytes: read once)."""
    _check_init_pair(init, reference_init)
    ref = _find(reference, source)
    if ref.rows != source.rows:
        raise PlelabError(f"--reference {reference} has {ref.rows} table rows, this checkpoint {source.rows}: the "
                          "rows must be the same token ids (widths and layer counts may differ)")
    a, b = source.load(), ref.load()
    ref_w0 = attached_w0(ref) if init is None and w0 is not None else None
    if init is not None:
        w0 = initial_of(source, init, "--init") if w0 is None else w0
        a, b = a - w0, b - initial_of(ref, reference_init, "--reference-init")
    elif ref_w0 is not None:  # both saved after plelab.attach: W_0 regenerated from the seeds they record
        a, b = a - w0, b - ref_w0
    delta = init is not None or ref_w0 is not None
    basis = ("Δ = W_t − W_0" + ("" if init is not None else " (W_0 regenerated from the seeds plelab.attach recorded)")
             if delta else "W_t (no W_0 given)")
    rows = ((a.flatten(1).norm(dim=1) > 0) | (b.flatten(1).norm(dim=1) > 0) if delta
            else torch.ones(len(a), dtype=torch.bool))
    if int(rows.sum()) < 3:
        raise PlelabError("fewer than 3 table rows changed since --init in either run: train further, or check that "
                          "--init is this run's step-0 checkpoint")
    keep = rows.numpy()

    def cka(x: torch.Tensor, y: torch.Tensor, seed: int) -> dict:
        return cka_against_null(x, y, counts[keep], seed=seed) if counts is not None else cka_with_null(x, y, seed)

    out: dict = {"basis": basis, "rows_compared": int(rows.sum()), "layers": []}
    if (source.num_layers, source.dim) == (ref.num_layers, ref.dim):
        out["layers"] = [cka(a[rows, i], b[rows, i], seed=i) for i in range(source.num_layers)]
    table = cka(a[rows].flatten(1), b[rows].flatten(1), seed=0)
    for layer in out["layers"]:
        layer["structure"] = structure_verdict(layer["cka"], layer["null_mean"], layer["null_sd"])[0]
    structure = structure_verdict(table["cka"], table["null_mean"], table["null_sd"])[0]
    how = ("rows shuffled within frequency bins of the data's token counts" if counts is not None
           else "rows shuffled among all rows: frequency not matched")
    caveat = ("" if delta else "; W_t agreement counts as learned only if the two checkpoints start "
              "from independent initialisations (give --init/--reference-init for Δ)")
    out["table"] = {**table, "structure": structure,
                    "reason": f"cross-seed CKA of {basis} {table['cka']:.3f} vs permutation null "
                              f"{table['null_mean']:.3f}±{table['null_sd']:.3f} over {out['rows_compared']:,} rows "
                              f"({how}){caveat}"}
    return out


def foreign_report(report: dict, source: TableSource, reference, init, reference_init,
                   use: ForeignUse | None, batch: int = 16) -> dict:
    """Fill ``report`` (the W_t part done) with the cross-seed agreement, the use test and both axes' verdicts."""
    counts = use.counts if use is not None else None
    if reference is not None:
        _check_init_pair(init, reference_init)
    w0 = initial_of(source, str(init), "--init") if init is not None else attached_w0(source)
    if init is None and w0 is not None:
        report["notes"].append("W_0 regenerated from the seed and init std plelab.attach recorded in config.json")
    agreement = (foreign_agreement(source, str(reference), init and str(init), reference_init and str(reference_init),
                                   counts, w0) if reference is not None else None)
    use_layers: dict[int, dict] = {}
    use_table = None
    if use is not None:
        device = use.table.device
        base, results = use_metrics(use.model, use.windows, w0, use.counts, batch=batch, device=device,
                                    table=(use.table, source.num_layers, source.dim))
        report["base_val_loss"] = base
        use_table = {r.kind: r.to_dict() for r in results if r.layer is None}
        for r in results:
            if r.layer is not None:
                use_layers.setdefault(r.layer, {})[r.kind] = r.to_dict()
        occ = use.counts[use.counts > 0]
        report["rows"] = {"total": source.rows, "used": int(len(occ)), "fraction_used": float((use.counts > 0).mean()),
                          "counted_in": use.data,
                          "occurrences_per_used_row": {"median": float(np.median(occ)), "p10": float(np.percentile(
                              occ, 10)), "p90": float(np.percentile(occ, 90)), "max": float(occ.max())}}
        report["notes"].append(f"use test: {len(use.windows)} windows of {use.windows.shape[1] - 1} tokens from "
                               f"{use.data}, through transformers; rows permuted within frequency bins of the data's "
                               "token counts" + ("" if w0 is not None else "; no --init, so no reset-to-W_0"))
    layer_cs = agreement["layers"] if agreement else []
    for i, layer in enumerate(report["layers"]):
        cs = layer_cs[i] if i < len(layer_cs) else {}
        if cs:
            layer["cross_seed"] = cs
        perm = use_layers.get(i, {}).get("permute")
        layer["use"] = use_layers.get(i)
        layer["verdict"] = layer_verdict(cs.get("cka"), cs.get("null_mean"), cs.get("null_sd"),
                                         delta=perm and perm["delta"], se=perm and perm["se"],
                                         layers=len(report["layers"])).to_dict()
    reasons = []
    structure = UNDECIDED
    if agreement is not None:
        structure = agreement["table"]["structure"]
        reasons.append(agreement["table"]["reason"])
        report["notes"].append(f"cross-seed agreement on {agreement['basis']} against {reference}")
    else:
        reasons.append("no --reference (a second seed's checkpoint): W_t alone cannot tell learned structure from "
                       "initialisation (a Gaussian table already has erank ≈ d and mean cos ≈ 0)")
    perm, reset = (use_table or {}).get("permute"), (use_table or {}).get("reset")
    use_line = verdict(delta=perm and perm["delta"], se=perm and perm["se"])
    if use is None:
        reasons.append("use test not run: give --data (text) and --tokenizer to run the model through transformers")
    else:
        reasons.append(use_line.reasons[1])
    if reset:
        reasons.append(f"reset-to-init costs {reset['delta']:+.4f}±{reset['se']:.4f} nats")
    report["table"] = {"cross_seed": ({k: agreement["table"][k] for k in ("cka", "null_mean", "null_sd", "null")}
                                      if agreement else None),
                       "basis": agreement["basis"] if agreement else None, "use": use_table,
                       "verdict": Verdict(structure, use_line.use, reasons).to_dict()}
    return report
