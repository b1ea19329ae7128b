"""GPU training throughput and MFU (bf16 autocast, torch.compile), and the table-placement checks.

For a machine with a CUDA GPU; one short run, a few minutes. Prints, for the preset (default gpu-125m)
at each dP: tokens/s and MFU against the device's dense bf16 peak (plelab.training.metrics.GPU_PEAK_BF16),
median over the timed steps after warm-up (compilation excluded). Then checks on the same GPU that
``train.table_device=cpu`` (table and its optimizer state in host memory, rows copied over per step)
gives the same losses as the on-device table with the row-sparse optimizer, and that
``plelab eval``'s memory-mapped table gives the in-memory validation loss.

    python bench/gpu_throughput.py                     # on a GPU
    python bench/gpu_throughput.py --device cpu --preset cpu-tiny --no-compile --steps 6 --warmup 2   # smoke

``--json PATH`` also writes the numbers (per dP: tokens/s, MFU, peak memory, the step-time overhead over dP=0; the
placement check's losses; the two eval losses) for ``bench/gpu_kit.sh``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from plelab.config import resolve_config
from plelab.runs import make_trainer, prepare_data


def run(preset: str, dp: int, sets: list[str], steps: int, data=None):
    cfg = resolve_config(preset, ["train.checkpoint_every=0", "train.eval_every=1000000", "train.diag_every=0",
                                  *sets], dp=dp, steps=steps)
    data = data or prepare_data(cfg, progress=False)
    tr = make_trainer(cfg, data, None, progress=False, log=lambda *a: None)
    return tr, data


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="gpu-125m")
    ap.add_argument("--dp", default="0,64,256")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", metavar="PATH", help="also write the numbers as JSON here")
    args = ap.parse_args()
    out: dict = {"preset": args.preset, "device": args.device, "compile": not args.no_compile,
                 "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
                 "torch": torch.__version__, "dp": {}}
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: this benchmark is for a GPU (use --device cpu for a smoke run)")
    torch.set_flush_denormal(True)
    base = [f"train.device={args.device}", f"train.compile={str(not args.no_compile).lower()}"]
    data = None
    for dp in [int(x) for x in args.dp.split(",")]:
        tr, data = run(args.preset, dp, base, args.steps, data)
        rows = [tr.train_step() for _ in range(args.steps)]
        timed = rows[args.warmup:]
        tps = statistics.median(r["tokens_per_second"] for r in timed)
        mfu = [r["mfu"] for r in timed if r["mfu"] is not None]
        peak_mem = torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else float("nan")
        mfu_text = (f"MFU {100 * statistics.median(mfu):.1f}% of {torch.cuda.get_device_name()}'s bf16 peak"
                    if mfu else "no MFU (unknown peak)")
        print(f"{args.preset} dP={dp}: {tps:,.0f} tokens/s, {mfu_text}; peak memory {peak_mem:.2f} GiB")
        out["dp"][dp] = {"tokens_per_second": tps, "mfu": statistics.median(mfu) if mfu else None,
                         "peak_memory_gib": peak_mem if peak_mem == peak_mem else None}
        trunk = out["dp"].get(0)
        if trunk is not None and dp:
            out["dp"][dp]["step_time_over_dp0"] = trunk["tokens_per_second"] / tps
        del tr
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    # placement: the same losses with the table on the host (row-sparse, no compile: sparse gradients)
    dp = max(int(x) for x in args.dp.split(","))
    losses = {}
    for where in ("auto", "cpu"):
        sets = [f"train.device={args.device}", "train.table_optimizer=row-sparse", f"train.table_device={where}",
                "train.precision=fp32"]
        tr, data = run(args.preset, dp, sets, 8, data)
        t0 = time.perf_counter()
        losses[where] = [tr.train_step()["loss"] for _ in range(8)]
        table = tr.lm.model.embed_tokens_per_layer.weight
        print(f"table_device={where}: losses {[round(v, 5) for v in losses[where]]} "
              f"({time.perf_counter() - t0:.1f} s for 8 steps); table on {table.device}")
    worst = max(abs(a - b) for a, b in zip(losses["auto"], losses["cpu"]))
    print(f"table on host vs on device: max |Δloss| {worst:.2e} ({'OK' if worst < 1e-3 else 'DIFFERENT'})")
    out["placement"] = {"dp": dp, "losses": losses, "max_abs_diff": worst, "ok": worst < 1e-3}
    with tempfile.TemporaryDirectory() as tmp:
        from plelab.cli import main as cli

        code = cli(["train", "--preset", args.preset, "--dp", str(dp), "--steps", "4", "--out", f"{tmp}/run",
                    "--no-progress", "--set", f"train.device={args.device}", "--set", "train.eval_every=4",
                    "--set", "train.diag_every=0"])
        if code != 0:
            raise SystemExit(f"plelab train failed (exit {code})")
        from plelab.training.evaluate import evaluate
        out["eval"] = {}
        for in_memory in (False, True):
            try:
                result = evaluate(f"{tmp}/run", device=args.device, table_in_memory=in_memory, progress=False)
            except Exception as err:  # the kit records a failure and goes on to its other checks
                raise SystemExit(f"plelab eval (table_in_memory={in_memory}) failed: {err}") from None
            out["eval"]["in_memory" if in_memory else "mapped"] = result["val_loss"]
            print(f"eval, table {'in memory' if in_memory else 'memory-mapped'}: {result['val_loss']:.6f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
