"""Where metrics go: ``RUN/metrics.jsonl`` always; TensorBoard and W&B when asked for; MFU on GPUs.

The JSONL file is the source of truth for reports. On resume it is cut back to the
checkpoint's step, so that a resumed run's file equals an uninterrupted run's.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

from plelab.errors import PlelabError
from plelab.io import atomic_write

# Dense bf16 peak FLOP/s by GPU name fragment (vendor data sheets; torchtitan / nanochat tables).
GPU_PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10": 125e12,
                 "4090": 165e12, "3090": 71e12, "B200": 2250e12}


def gpu_peak_flops(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of a known CUDA device, else ``None`` (then no MFU is reported)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peak in GPU_PEAK_BF16.items():
        if key in name:
            return peak
    return None


def truncate_jsonl(path: Path, last_step: int) -> None:
    """Keep only rows with ``step <= last_step`` (atomic rewrite). A line cut short by a crash
    (not valid JSON) is dropped."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= last_step:
            keep.append(line)
    atomic_write(path, lambda p: p.write_text("".join(line + "\n" for line in keep)))


class MetricSinks:
    """Append-only JSONL plus optional TensorBoard / W&B writers (rank 0 only)."""

    @staticmethod
    def check_available(tc) -> None:
        """Fail before anything is written if an asked-for optional sink is not installed."""
        if tc.tensorboard and importlib.util.find_spec("tensorboard") is None:
            raise PlelabError("train.tensorboard=true needs the tensorboard package: pip install tensorboard")
        if tc.wandb_project and importlib.util.find_spec("wandb") is None:
            raise PlelabError("train.wandb_project is set but wandb is not installed: pip install wandb")

    def __init__(self, run_dir: Path, tensorboard: bool, wandb_project: str | None, config: dict) -> None:
        self.jsonl = (run_dir / "metrics.jsonl").open("a")
        self.tb = None
        self.wandb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter  # optional: needs the tensorboard package
            except ImportError:
                raise PlelabError("train.tensorboard=true needs the tensorboard package: "
                                  "pip install tensorboard") from None
            self.tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        if wandb_project:
            try:
                import wandb  # optional: train.wandb_project only
            except ImportError:
                raise PlelabError("train.wandb_project is set but wandb is not installed: pip install wandb") from None
            self.wandb = wandb.init(project=wandb_project, dir=str(run_dir), config=config, name=run_dir.name)

    def write(self, row: dict) -> None:
        try:
            self.jsonl.write(json.dumps(row) + "\n")
            self.jsonl.flush()
        except OSError as err:
            raise PlelabError(f"cannot append to {self.jsonl.name}: {err.strerror or err}; free space (or fix the "
                              "folder) and continue the run with --resume from its last checkpoint") from None
        step = row["step"]
        if self.tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in row.items() if k != "step"}, step=step)

    def close(self) -> None:
        try:
            self.jsonl.close()
        except OSError:  # a full disk: write() already said so; the lines it could not flush are lost
            pass
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def step_line(row: dict, steps: int) -> str:
    """The one-line rank-0 step log."""
    parts = [f"step {row['step']:>{len(str(steps))}}/{steps}", f"loss {row['loss']:.4f}"]
    if "val_loss" in row:
        parts.append(f"val {row['val_loss']:.4f}")
    if "ood_loss" in row:
        parts.append(f"ood {row['ood_loss']:.4f}")
    parts += [f"lr {row['lr']:.2e}", f"gnorm {row['grad_norm']:.2f}", f"{row['tokens_per_second']:,.0f} tok/s",
              f"epoch {row['epoch']:.2f}"]
    if row.get("mfu") is not None:
        parts.append(f"mfu {100 * row['mfu']:.1f}%")
    return " | ".join(parts)
