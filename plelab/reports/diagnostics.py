"""Terminal table and PNG plots for a ``plelab diagnose`` report (the dict from ``diagnose``)."""

from __future__ import annotations

import json
from pathlib import Path

from plelab.io import atomic_write
from plelab.reports.figures import pyplot
from plelab.reports.tables import format_table


def _f(x, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def diagnostics_text(rep: dict) -> str:
    """Per-layer metrics beside their nulls, then the verdict lines."""
    vp, L, dP = rep["shape"]
    head = f"per-layer table {rep['key']} [{vp:,} × {L}·{dP}] from {rep['table_file']}"
    if rep.get("step") is not None:
        head += f" (step {rep['step']})"
    lines = [head]
    rows = rep.get("rows")
    if rows:
        occ = rows["occurrences_per_used_row"]
        lines.append(f"rows used {rows['used']:,}/{rows['total']:,} ({100 * rows['fraction_used']:.1f}%); occurrences "
                     f"per used row: median {occ['median']:,.0f}, p10 {occ['p10']:,.0f}, p90 {occ['p90']:,.0f}")
        strata = ", ".join(f"{b['occurrences']}: {b['rows']} rows |Δ| {b['mean_delta_norm']:.3f}"
                           for b in rows.get("delta_by_occurrence", []))
        if strata:
            lines.append(f"change since init by occurrences — {strata}")
    table_rows = []
    for layer in rep["layers"]:
        wt, null, mp = layer["wt_all"], layer["null_all"], layer["mp_all"]
        d = layer.get("delta_used") or {}
        nd = layer.get("null_run_delta_used") or {}
        cs = layer.get("cross_seed") or {}
        use = (layer.get("use") or {}).get("permute") or {}
        v = layer["verdict"]
        table_rows.append([
            layer["layer"], f"{wt['erank_raw']:.1f}/{null['erank_raw']:.1f}/{mp['erank_ratio'] * min(vp, dP):.1f}",
            f"{wt['pc1']:.4f}/{null['pc1']:.4f}", f"{wt['mean_cos']:+.4f}",
            f"{_f(d.get('erank_centred'), '.1f')}/{_f(d.get('pc1'), '.3f')}"
            + (f" (null run {nd['erank_centred']:.1f}/{nd['pc1']:.3f})" if nd else ""),
            f"{_f(cs.get('cka'))}/{_f(cs.get('null_mean'))}",
            f"{_f(use.get('delta'), '+.4f')}±{_f(use.get('se'), '.4f')}",
            v["structure"].replace("NOT DISTINGUISHABLE FROM NULL", "NULL-LIKE"), v["use"]])
    lines += ["", format_table(
        ["layer", "W_t erank (all rows) / Gaussian / MP", "PC1 / Gaussian", "mean cos", "Δ erank/PC1 (used)",
         "cross-seed CKA / null", "permute Δloss (nats)", "STRUCTURE", "USE"], table_rows)]
    pred = rep.get("predictiveness")
    if pred:
        target = "yes" if pred["is_prediction_target"] else "no"
        lines += ["", f"id space: {pred['id_space']}; prediction target: {target};"
                      f" per-id logit offsets on the frozen model gain {pred['val_gain_nats']:+.4f} nats/token on "
                      f"validation ({pred['train_gain_nats']:+.4f} on the fit tokens); mean gradient per used row "
                      f"{pred['mean_row_grad_norm']:.2e}"]
    tv = rep["table"]["verdict"]
    lines += ["", f"whole table: {tv['structure']}, {tv['use']}, {tv.get('benefit', 'UNDECIDED')}"]
    lines += [f"  - {r}" for r in tv["reasons"]]
    lines += [f"reliability: {r}" for r in rep.get("reliability", [])]
    lines += [f"note: {n}" for n in rep.get("notes", [])]
    return "\n".join(lines)


def write_json_report(rep: dict, path: str | Path) -> Path:
    return atomic_write(path, lambda p: p.write_text(json.dumps(rep, indent=1) + "\n"))


def plot_run_history(run_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """PNG: the live per-layer signal metrics (metrics.jsonl ``diag`` rows) against the step."""
    plt = pyplot()
    metrics = Path(run_dir) / "metrics.jsonl"
    rows = []
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if "diag" in row:
                rows.append(row)
    if not rows:
        return []
    if "snr" in rows[0]["diag"]:  # PLE's per-layer signals
        keys = [("snr", "injection RMS / hidden RMS"), ("table_to_proj", "table part / projection part"),
                ("gate", "gate activity"), ("grad_table", "gradient norm at the table slice")]
    else:  # another kind of table: whole-table numbers (plelab.Monitor)
        keys = [("table_grad_norm", "gradient norm of the table"), ("rows_touched", "share of rows looked up")]
    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2), squeeze=False)
    for ax, (key, title) in zip(axes[0], keys):
        series = [r["diag"].get(key) for r in rows]
        per_layer = series and isinstance(series[0], list)
        for layer in range(len(series[0]) if per_layer else 1):
            values = [v[layer] if per_layer else v for v in series]
            if all(v is not None for v in values):
                ax.plot(steps, values, label=f"layer {layer}" if per_layer else "whole table")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "diagnostics_by_step.png"
    atomic_write(path, lambda p: fig.savefig(p, dpi=110, format="png"))
    plt.close(fig)
    return [path]


def plot_diagnostics(rep: dict, out_dir: str | Path) -> list[Path]:
    """PNG plots: metrics vs layer, each beside its null. Returns the files written."""
    plt = pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    layers = [layer["layer"] for layer in rep["layers"]]
    panels = [("W_t erank (all rows)", [x["wt_all"]["erank_raw"] for x in rep["layers"]],
               [x["null_all"]["erank_raw"] for x in rep["layers"]]),
              ("W_t PC1 share", [x["wt_all"]["pc1"] for x in rep["layers"]],
               [x["null_all"]["pc1"] for x in rep["layers"]])]
    if "delta_used" in rep["layers"][0]:
        panels.append(("Δ erank (used rows, centred)", [x["delta_used"]["erank_centred"] for x in rep["layers"]],
                       [x["null_used"]["erank_centred"] for x in rep["layers"]]))
    if "cross_seed" in rep["layers"][0]:
        panels.append(("cross-seed CKA of Δ", [x["cross_seed"]["cka"] for x in rep["layers"]],
                       [x["cross_seed"]["null_mean"] + 4 * x["cross_seed"]["null_sd"] for x in rep["layers"]]))
    if rep["layers"][0].get("use"):
        panels.append(("permute-rows Δloss (nats)", [x["use"]["permute"]["delta"] for x in rep["layers"]],
                       [0.0 for _ in rep["layers"]]))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False)
    for ax, (title, values, null) in zip(axes[0], panels):
        ax.plot(layers, values, "o-", label="table")
        ax.plot(layers, null, "k--", label="null / threshold")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{Path(rep['source']).name}: {rep['table']['verdict']['structure']}, "
                 f"{rep['table']['verdict']['use']}", fontsize=10)
    fig.tight_layout()
    path = out / "diagnostics_by_layer.png"
    atomic_write(path, lambda p: fig.savefig(p, dpi=110, format="png"))
    plt.close(fig)
    return [path]
