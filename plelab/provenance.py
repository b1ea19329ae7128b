"""What every run records about where it came from: seed, config, data, versions, git commit."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import numpy
import tokenizers
import torch

import plelab
from plelab.precision import cpu_model


def git_commit() -> str | None:
    """The commit of the plelab checkout this code runs from (``None`` outside a git checkout)."""
    root = Path(plelab.__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=5).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")


def versions() -> dict[str, str]:
    return {"plelab": plelab.__version__, "python": platform.python_version(), "torch": torch.__version__,
            "numpy": numpy.__version__, "tokenizers": tokenizers.__version__, "platform": sys.platform,
            "cpu": cpu_model()}


def provenance(cfg, corpus_fingerprint: str | None) -> dict:
    return {"seed": cfg.seed, "preset": cfg.preset, "corpus_fingerprint": corpus_fingerprint,
            "versions": versions(), "git_commit": git_commit(), "config": cfg.to_dict()}
