"""Cross-seed agreement of two per-layer tables plelab did not train (HF checkpoints, bare safetensors).

Without row counts, the frequency-matched null of a plelab run is not available. The null here shuffles the
reference's rows among all rows (20 draws). It therefore also credits agreement that only token frequency explains
(frequent tokens' rows move more in both runs). The output says so.

- With ``init`` and ``reference_init`` (step-0 checkpoints of both runs), the compared matrices are
  Δ = W_t − W_0 on the rows either run changed. That is the cross-seed test of a plelab run, without frequency
  matching.
- Without them the matrices are W_t themselves. Two seeds' random inits agree only at the null level, so W_t
  agreement above it is learned — *if* the two checkpoints start from independent initialisations. Two
  fine-tunes of one pretrained model agree from step 0, which is why the verdict names its basis.
"""

from __future__ import annotations

import numpy as np
import torch

from plelab.diagnostics.structure import linear_cka, unit_rows
from plelab.diagnostics.tables import TableSource, find_table
from plelab.diagnostics.verdict import structure_verdict
from plelab.errors import PlelabError

NULL_DRAWS = 20


def _find(path: str, like: TableSource) -> TableSource:
    """A table by its own config; a bare table without one is read with ``like``'s L and dP."""
    try:
        return find_table(path)
    except PlelabError:
        return find_table(path, like.num_layers, like.dim)


def _init_of(source: TableSource, init: str, what: str) -> torch.Tensor:
    w0 = _find(init, source)
    if (w0.rows, w0.num_layers, w0.dim) != (source.rows, source.num_layers, source.dim):
        raise PlelabError(f"{what} {init} has a table of shape {[w0.rows, w0.num_layers, w0.dim]}, the checkpoint "
                          f"{[source.rows, source.num_layers, source.dim]}; give the step-0 checkpoint of this run")
    return w0.load()


def cka_with_null(a: torch.Tensor, b: torch.Tensor, seed: int = 0) -> dict:
    """Linear CKA of unit rows of ``a`` and ``b`` (``[N, d_a]``, ``[N, d_b]``) against ``b``'s rows shuffled."""
    ua, ub = unit_rows(a.double()), unit_rows(b.double())
    g = torch.Generator().manual_seed(seed)
    nulls = [linear_cka(ua, ub[torch.randperm(len(ub), generator=g)]) for _ in range(NULL_DRAWS)]
    return {"cka": linear_cka(ua, ub), "null_mean": float(np.mean(nulls)), "null_sd": float(np.std(nulls, ddof=1)),
            "null": "rows permuted among all rows (no row counts: frequency not matched)"}


def foreign_agreement(source: TableSource, reference: str, init: str | None, reference_init: str | None) -> dict:
    """The ``diagnose`` report's structure part for two foreign tables: per-layer and whole-table CKA against the
    null, on Δ (both inits given) or on W_t (neither), and the verdict with its basis."""
    if (init is None) != (reference_init is None):
        raise PlelabError("--init and --reference-init go together: Δ = W_t − W_0 needs the step-0 table of both runs "
                          "(or give neither, for agreement of W_t)")
    ref = _find(reference, source)
    if ref.rows != source.rows:
        raise PlelabError(f"--reference {reference} has {ref.rows} table rows, this checkpoint {source.rows}: the "
                          "rows must be the same token ids (widths and layer counts may differ)")
    a, b = source.load(), ref.load()
    if init is not None:
        a, b = a - _init_of(source, init, "--init"), b - _init_of(ref, reference_init, "--reference-init")
    basis = "Δ = W_t − W_0" if init is not None else "W_t (no W_0 given)"
    changed = (a.flatten(1).norm(dim=1) > 0) | (b.flatten(1).norm(dim=1) > 0) if init is not None else None
    rows = changed if changed is not None else torch.ones(len(a), dtype=torch.bool)
    if int(rows.sum()) < 3:
        raise PlelabError("fewer than 3 table rows changed since --init in either run: train further, or check that "
                          "--init is this run's step-0 checkpoint")
    out: dict = {"basis": basis, "rows_compared": int(rows.sum()), "layers": []}
    if (source.num_layers, source.dim) == (ref.num_layers, ref.dim):
        out["layers"] = [cka_with_null(a[rows, i], b[rows, i], seed=i) for i in range(source.num_layers)]
    table = cka_with_null(a[rows].flatten(1), b[rows].flatten(1))
    for layer in out["layers"]:
        layer["structure"] = structure_verdict(layer["cka"], layer["null_mean"], layer["null_sd"])[0]
    structure = structure_verdict(table["cka"], table["null_mean"], table["null_sd"])[0]
    caveat = ("" if init is not None else "; W_t agreement counts as learned only if the two checkpoints start "
              "from independent initialisations (give --init/--reference-init for Δ)")
    out["table"] = {**table, "structure": structure,
                    "reason": f"cross-seed CKA of {basis} {table['cka']:.3f} vs permutation null "
                              f"{table['null_mean']:.3f}±{table['null_sd']:.3f} over {out['rows_compared']:,} rows "
                              f"(rows shuffled among all rows: frequency not matched){caveat}"}
    return out
