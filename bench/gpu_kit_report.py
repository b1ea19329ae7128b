"""The GPU kit's one JSON (``bench/gpu_kit.sh``): every step's status and numbers gathered into OUT/gpu_kit.json.

    python bench/gpu_kit_report.py OUT
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import torch

from plelab.provenance import git_commit


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _losses(run: Path) -> list[float] | None:
    try:
        return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()
                if "loss" in json.loads(line)]
    except (OSError, ValueError, KeyError):
        return None


def main(out: Path) -> dict:
    status = {p.stem.removeprefix("status-"): p.read_text().strip() for p in sorted(out.glob("status-*.txt"))}
    whole, part = _losses(out / "fsdp-whole"), _losses(out / "fsdp-part")
    rung = _json(out / "rung-real.json")
    report = {
        "machine": {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                    "torch": torch.__version__, "python": platform.python_version(), "commit": git_commit()},
        "status": status,
        "throughput": _json(out / "throughput.json"),
        "fsdp": {"losses_straight": whole, "losses_resumed": part,
                 "resume_equal": whole is not None and whole == part,
                 "max_abs_diff": (max(abs(a - b) for a, b in zip(whole, part))
                                  if whole and part and len(whole) == len(part) else None)},
        "rung": {"verdict": ((rung or {}).get("table") or {}).get("verdict"),
                 "reliability": (rung or {}).get("reliability"), "diagnose": rung},
    }
    (out / "gpu_kit.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({"status": status, "fsdp_resume_equal": report["fsdp"]["resume_equal"],
                      "rung_verdict": {k: v for k, v in (report["rung"]["verdict"] or {}).items() if k != "reasons"}},
                     indent=1))
    return report


if __name__ == "__main__":
    main(Path(sys.argv[1]))
