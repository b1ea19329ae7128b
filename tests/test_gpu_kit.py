"""bench/gpu_kit.sh (the one prepared GPU check): the script parses, and its report gathers the steps' results."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_the_kit_parses_and_its_report_gathers_every_step(tmp_path, capsys):
    assert subprocess.run(["bash", "-n", str(BENCH / "gpu_kit.sh")]).returncode == 0
    spec = importlib.util.spec_from_file_location("gpu_kit_report", BENCH / "gpu_kit_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    (tmp_path / "status-throughput.txt").write_text("ok\n")
    (tmp_path / "status-fsdp.txt").write_text("timed out\n")
    (tmp_path / "throughput.json").write_text(json.dumps({"dp": {"0": {"tokens_per_second": 1.0}}}))
    for run, losses in (("fsdp-whole", [3.0, 2.5]), ("fsdp-part", [3.0, 2.75])):
        (tmp_path / run).mkdir()
        rows = [{"step": i + 1, "loss": v} for i, v in enumerate(losses)] + [{"step": 2, "val_loss": 2.0}]
        (tmp_path / run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = report.main(tmp_path)
    assert out["status"] == {"fsdp": "timed out", "throughput": "ok"}
    assert out["fsdp"]["resume_equal"] is False and out["fsdp"]["max_abs_diff"] == 0.25
    assert out["throughput"]["dp"]["0"]["tokens_per_second"] == 1.0 and out["rung"]["verdict"] is None
    assert json.loads((tmp_path / "gpu_kit.json").read_text()) == out
