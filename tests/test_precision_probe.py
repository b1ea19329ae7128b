"""The precision probe can be wrong safely (issue 53 item 8): a reading outside physically plausible bounds (a
bf16/fp32 ratio beyond the large GEMM's measured in the same process, or beyond the stated MAX_BF16_RATIO) is
discarded and measured again, never stored; the stored file holds the readings it decided from."""

from __future__ import annotations

import json
import math

import pytest
import torch

import plelab.precision as precision
from plelab.precision import MAX_BF16_RATIO, PEAK_SLACK, is_plausible, plausible_bound, resolve_precision

CPU = torch.device("cpu")
GEMMS = [(256, 64, 176)]


@pytest.fixture
def amx(monkeypatch, tmp_path):
    """An AMX CPU whose large GEMM gains 3× in bf16, a fresh cache; returns the list the mocked probe's calls go to."""
    monkeypatch.setenv("PLELAB_CACHE", str(tmp_path))
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: ("amx_bf16",))
    monkeypatch.setattr(precision, "gemm_peak_ratio", lambda: 3.0)
    return tmp_path / "precision"


def _probe(monkeypatch, readings):
    calls = []
    it = iter(readings)
    monkeypatch.setattr(precision, "probe_bf16", lambda g: calls.append(g) or next(it))
    return calls


def test_the_bounds():
    assert plausible_bound(3.0) == 3.0 * PEAK_SLACK and plausible_bound(1e6) == MAX_BF16_RATIO
    assert plausible_bound(math.nan) == MAX_BF16_RATIO and plausible_bound(0.0) == MAX_BF16_RATIO
    assert is_plausible(2.0, 1.0, 6.0) and not is_plausible(73.1, 1.0, 6.0) and not is_plausible(7.0, 1.0, 6.0)
    assert not is_plausible(73.1, 1.0) and not is_plausible(1.0, 40.0)  # beyond the stated bound either way
    for bad in ((0.0, 1.0), (1.0, 0.0), (math.nan, 1.0), (1.0, math.inf), (-1.0, 1.0)):
        assert not is_plausible(*bad)
    ratio = precision.gemm_peak_ratio(size=32, repeats=1)  # the real measurement: a positive number
    assert ratio > 0


def test_an_impossible_reading_is_discarded_measured_again_and_the_file_records_the_readings(monkeypatch, amx):
    calls = _probe(monkeypatch, [(73.1, 1.0), (2.0, 1.0)])  # under load: bf16 "73.10×" faster; then a sane 2×
    choice = resolve_precision("auto", CPU, GEMMS)
    assert len(calls) == 2 and choice.resolved == "bf16" and "2.00×" in choice.reason
    assert "73.10" not in choice.reason and "1 implausible reading(s) discarded" in choice.reason
    (stored,) = amx.glob("*.json")
    saved = json.loads(stored.read_text())
    assert (saved["fp32_s"], saved["bf16_s"], saved["decided_from"]) == (2.0, 1.0, 1)
    assert [r["ratio"] for r in saved["readings"]] == [73.1, 2.0]
    assert [r["plausible"] for r in saved["readings"]] == [False, True]
    assert saved["readings"][0]["bound"] == 3.0 * PEAK_SLACK and saved["readings"][0]["peak_ratio"] == 3.0
    again = resolve_precision("auto", CPU, GEMMS)  # a later run reads the stored, plausible reading
    assert again.resolved == "bf16" and "stored in" in again.reason and len(calls) == 2


def test_when_every_reading_is_implausible_it_trains_fp32_and_stores_nothing(monkeypatch, amx):
    calls = _probe(monkeypatch, [(73.1, 1.0), (40.0, 1.0), (7.0, 1.0), (1.5, 1.0)])
    choice = resolve_precision("auto", CPU, GEMMS)
    assert choice.resolved == "fp32" and len(calls) == precision.PROBE_ATTEMPTS
    assert "implausible" in choice.reason and "73.10×" in choice.reason and "not stored" in choice.reason
    assert not amx.exists() or not list(amx.glob("*.json"))
    assert resolve_precision("auto", CPU, GEMMS).resolved == "bf16" and len(calls) == 4  # probed again
    assert resolve_precision("auto", CPU, [(8, 8, 8)], probe=lambda g: (73.1, 1.0)).resolved == "fp32"  # explicit


def test_a_stored_impossible_reading_is_not_trusted(monkeypatch, amx):
    calls = _probe(monkeypatch, [(1.0, 1.0)])
    resolve_precision("auto", CPU, GEMMS)
    (stored,) = amx.glob("*.json")
    saved = json.loads(stored.read_text())
    stored.write_text(json.dumps({"key": saved["key"], "fp32_s": 73.1, "bf16_s": 1.0, "when": "then"}))  # an older
    calls = _probe(monkeypatch, [(1.1, 1.0)])  # plelab's file with the 73× reading
    choice = resolve_precision("auto", CPU, GEMMS)
    assert len(calls) == 1 and choice.resolved == "fp32" and "1.10×" in choice.reason
    assert json.loads(stored.read_text())["fp32_s"] == 1.1
