"""Plain-text tables (aligned columns, right-justified numbers) for terminal output and logs."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence

from plelab.model.accounting import Accounting


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str | None = None) -> str:
    """Render rows as an aligned text table; numbers right-aligned, text left-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]

    def is_num(s: str) -> bool:
        return s.replace(",", "").replace(".", "").replace("%", "").replace("+", "").replace("-", "").isdigit()

    def line(row: Sequence[str]) -> str:
        return "  ".join(s.rjust(w) if is_num(s) else s.ljust(w) for s, w in zip(row, widths)).rstrip()

    out = [title] if title else []
    out += [line(list(headers)), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _arm(a: Accounting) -> str | int:
    """A row's name: its dP (PLE rows, 0 = the trunk), or its aux kind."""
    return a.aux if a.aux != "ple" else a.dim


def accounting_tables(preset: str, rows: list[Accounting], shape: str) -> str:
    """The seed's dP table, the PLE breakdown and the compute view, as exact integers; rows of the table family's
    other kinds (``aux.kind``) are named by their kind, with their own breakdown."""
    base = rows[0].base
    aux = any(a.aux != "ple" for a in rows)
    first = "dP / kind" if aux else "dP"
    t1 = format_table(
        [first, "added params", "% of base", "total params"],
        [[_arm(a), f"{a.added:,}" if a.added else "—", f"{a.added_pct:.2f}%" if a.added else "—", f"{a.total:,}"]
         for a in rows],
        title=f"{'Table' if aux else 'PLE'} parameter accounting — preset {preset} ({shape}); base (dP=0) = {base:,}",
    )
    t2 = format_table(
        ["dP", "table Vp·L·dP", "model-level proj+norm", "per-layer gate+proj+norm", "added"],
        [[a.dim, f"{a.groups['ple_table']:,}", f"{a.groups['ple_model_projection']:,}",
          f"{a.groups['ple_per_layer']:,}", f"{a.added:,}"] for a in rows if a.dim],
        title="PLE breakdown",
    )
    t2b = format_table(
        ["kind", "table rows × width", "gates / projection / scales", "added"],
        [[a.aux, f"{a.groups['aux_table']:,}", f"{a.groups['aux_other']:,}", f"{a.added:,}"]
         for a in rows if a.aux != "ple"],
        title="Other kinds' breakdown (value: per-layer tables + per-head gates; ngram: hashed table + projection + "
              "per-layer λ; modulation: one [V, L·H] table)",
    )
    t3 = format_table(
        [first, "matmul params", "lookup params", f"train FLOPs/token (T={rows[0].seq_len})", "vs dP=0"],
        [[_arm(a), f"{a.matmul:,}", f"{a.groups['embed_tokens'] + a.groups['ple_table'] + a.groups['aux_table']:,}",
          f"{a.flops_per_token:,}", f"{100.0 * (a.flops_per_token / rows[0].flops_per_token - 1):+.2f}%"]
         for a in rows],
        title="Compute (lookups excluded from FLOPs; the tied LM head counts as a matmul)",
    )
    parts = (t1, t2 if any(a.dim for a in rows) else "", t2b if aux else "", t3)
    return "\n\n".join(t for t in parts if t)


def comparison_cells(c: dict | None) -> list[str]:
    """A comparison's Δ, its 95% CI and its label as table cells (— without one)."""
    if not c:
        return ["—", "—", "—"]
    return [fmt(c["mean"], "+.4f"), f"[{fmt(c['ci_low'], '+.4f')}, {fmt(c['ci_high'], '+.4f')}]", c["label"]]


def fmt(x, spec: str = ".4f") -> str:
    """``x`` formatted with ``spec``; "—" for a missing or non-finite number."""
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def csv_text(head: list[str], rows: list[list]) -> str:
    """A CSV document (header + rows) as text."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(head)
    w.writerows(rows)
    return buf.getvalue()


def ci_cell(c: dict | None) -> str:
    """One paired comparison (``stats.Comparison.to_dict()``) as ``mean [CI low, CI high] label`` in a cell."""
    if not c:
        return "—"
    if c["ci_low"] is None:
        return f"{c['mean']:+.4f} (n={c['n']})"
    return f"{c['mean']:+.4f} [{c['ci_low']:+.4f}, {c['ci_high']:+.4f}] {c['label']}"
