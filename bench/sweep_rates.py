"""The model FLOP rates finished sweep runs sustained: what the sweep runtime estimate assumes and measures.

    python bench/sweep_rates.py SWEEP [SWEEP ...]

For every finished run under the sweep folders (a ``summary.json``), its model FLOPs
(:func:`plelab.sweeps.eta.run_flops`: training plus evaluation forward passes) over its ``wall_seconds``;
printed per preset and thread count as the median and range, with the machine line. The rates are what
:data:`plelab.sweeps.eta.ASSUMED_CORE_FLOPS` is set from (per thread), and what a sweep measures for itself once
its first runs finish. Runs measured side by side on a busy machine read low: quote a sweep that ran alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine  # noqa: E402

from plelab.config.resolve import resolve_run_config  # noqa: E402
from plelab.sweeps.eta import run_flops  # noqa: E402


def rates(folders: list[str]) -> dict[tuple[str, int, bool], list[float]]:
    """``(preset, threads, visual) -> [GFLOP/s, …]`` over the finished runs under ``folders``."""
    out: dict[tuple[str, int, bool], list[float]] = defaultdict(list)
    for folder in folders:
        for summary in sorted(Path(folder).glob("**/summary.json")):
            cfg = resolve_run_config(saved=summary.parent / "config.json")
            wall = json.loads(summary.read_text())["wall_seconds"]
            out[(cfg.preset, cfg.train.threads or 0, cfg.visual.enabled)].append(run_flops(cfg) / wall / 1e9)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", help="finished (or partly finished) sweep folders")
    args = ap.parse_args()
    print(machine())
    found = rates(args.sweeps)
    if not found:
        raise SystemExit(f"no finished runs (summary.json) under {', '.join(args.sweeps)}")
    for (preset, threads, visual), values in sorted(found.items()):
        print(f"{preset}{' (visual)' if visual else ''}, {threads or 'all'} thread(s): {len(values)} runs, median "
              f"{statistics.median(values):.1f} GFLOP/s per run [{min(values):.1f}, {max(values):.1f}]")


if __name__ == "__main__":
    main()
