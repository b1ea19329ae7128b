"""`plelab diagnose` on a large per-layer table: time and peak memory, against reading the file
and one Gram pass over it, each in its own subprocess.

Default: a Gemma-3n-E2B-sized table (262,144 × 30·256 = 7,680 columns, bf16, 4 GiB on disk),
random values, written once to --dir.

    python bench/diagnose_table.py --dir /tmp/plelab-bench            # E2B size
    python bench/diagnose_table.py --dir /tmp/plelab-bench --rows 32768   # a quick look
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

KEY = "model.language_model.embed_tokens_per_layer.weight"


def make(path: Path, rows: int, layers: int, dim: int) -> None:
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    table = (torch.randn(rows, layers * dim, generator=gen) * 0.02).to(torch.bfloat16)
    save_file({KEY: table}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"text_config": {"num_hidden_layers": layers,
                                                                  "hidden_size_per_layer_input": dim}}))


def _status_mib(field: str) -> float:
    """VmHWM / VmRSS of this process in MiB (per address space, so not inherited across exec,
    unlike getrusage's ru_maxrss)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(mode: str, path: Path) -> None:
    import torch

    import plelab.diagnostics.diagnose  # noqa: F401  (same imports in every mode: a fair baseline)
    from plelab.diagnostics.tables import find_table

    base = _status_mib("VmRSS")
    t0 = time.perf_counter()
    if mode == "diagnose":
        from plelab.diagnostics.diagnose import diagnose_run as diagnose

        rep = diagnose(path, progress=False)
        extra = {"layer0_erank": rep["layers"][0]["wt_all"]["erank_raw"]}
    else:
        src = find_table(path)
        grams = [torch.zeros(src.dim, src.dim, dtype=torch.float64) for _ in range(src.num_layers)]
        for _, chunk in src.chunks():
            if mode == "gram":
                for i, g in enumerate(grams):
                    x = chunk[:, i].double()
                    g += x.T @ x
        extra = {}
    print(json.dumps({"mode": mode, "seconds": time.perf_counter() - t0, "peak_rss_mib": _status_mib("VmHWM"),
                      "rss_before_mib": base, **extra}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--rows", type=int, default=262_144)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    path = Path(args.dir)
    if args.child:
        return child(args.child, path)
    path.mkdir(parents=True, exist_ok=True)
    if not (path / "model.safetensors").exists():
        subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                        f"import diagnose_table as d; from pathlib import Path; "
                        f"d.make(Path({str(path)!r}), {args.rows}, {args.layers}, {args.dim})"], check=True)
    size = (path / "model.safetensors").stat().st_size / 2**30
    print(f"table {args.rows:,} × {args.layers}·{args.dim} bf16 ({size:.2f} GiB) in {path}")
    results = {}
    for mode in ("read", "gram", "diagnose"):
        out = subprocess.run([sys.executable, __file__, "--dir", str(path), "--child", mode],
                             capture_output=True, text=True, check=True)
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        r = results[mode]
        print(f"{mode:9s} {r['seconds']:7.1f} s   peak RSS {r['peak_rss_mib']:7.0f} MiB "
              f"(interpreter + torch before: {r['rss_before_mib']:.0f} MiB)")
    d = results["diagnose"]
    print(f"diagnose / read = {d['seconds'] / results['read']['seconds']:.2f}x, "
          f"diagnose / (read + one Gram pass) = {d['seconds'] / results['gram']['seconds']:.2f}x; "
          f"extra peak over the interpreter: {d['peak_rss_mib'] - d['rss_before_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
