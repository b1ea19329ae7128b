"""Golden loss curve: a short cpu-tiny run whose per-step losses are stored in the repository.

Any change in numerics (model, init, data, optimizer) shows up here. Update the curve only
deliberately, and say why in the commit message:

    PLELAB_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py
"""

import json
import os
from pathlib import Path

import pytest

from plelab.config import resolve_config
from plelab.runs import train

GOLDEN = Path(__file__).parent / "golden" / "cpu_tiny_losses.json"
STEPS = 30


def test_cpu_tiny_loss_curve_matches_golden(tiny_data):
    cfg = resolve_config("cpu-tiny", steps=STEPS)
    result = train(cfg, data=tiny_data, progress=False, log=lambda *a: None)
    current = {"steps": STEPS, "preset": "cpu-tiny", "seed": cfg.seed,
               "corpus_fingerprint": tiny_data.corpus_fingerprint,
               "train_losses": result.train_losses, "val_history": result.val_history}
    if os.environ.get("PLELAB_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(current, indent=1) + "\n")
        pytest.skip("golden curve rewritten")
    golden = json.loads(GOLDEN.read_text())
    if golden["corpus_fingerprint"] != tiny_data.corpus_fingerprint:
        pytest.skip("this Python's embedded corpus differs from the golden curve's (made on CPython 3.11.7); "
                    "regenerate the curve deliberately for a new reference interpreter")
    assert result.train_losses == pytest.approx(golden["train_losses"], abs=5e-5, rel=0)
    assert [v for _, v in result.val_history] == pytest.approx([v for _, v in golden["val_history"]], abs=5e-5, rel=0)
