"""Shared fixtures: an isolated cache folder, CPU hygiene, tiny configs and a small token stream."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from plelab.config import resolve_config


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    import plelab.precision

    mp = pytest.MonkeyPatch()
    mp.setenv("PLELAB_CACHE", str(tmp_path_factory.mktemp("plelab-cache")))
    # as _no_bf16_flags below, for the module- and session-scoped fixtures too (they are set up before it)
    mp.setattr(plelab.precision, "cpu_bf16_flags", lambda: ())
    torch.set_flush_denormal(True)
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def _no_bf16_flags(monkeypatch):
    """``train.precision=auto`` resolves as on a CPU without bf16 units (fp32, no probe), so the suite's losses do
    not depend on CI's CPU; tests of the rule mock the flags themselves."""
    import plelab.precision

    monkeypatch.setattr(plelab.precision, "cpu_bf16_flags", lambda: ())


@pytest.fixture
def tiny_cfg():
    return resolve_config("cpu-tiny")


@pytest.fixture(scope="session")
def sweep_dir(tmp_path_factory, tiny_data):
    """The suite's tiny dP sweep (``tests/tiny_sweeps.py``), run once; tests read it and may add reports to it."""
    from tiny_sweeps import tiny_spec

    from plelab.sweeps.runner import run_sweep

    root = tmp_path_factory.mktemp("sweep")
    run_sweep(root, tiny_spec(), progress=False, log=lambda *a: None)
    return root


@pytest.fixture(scope="session")
def tiny_data():
    """The embedded corpus tokenised with a 512-entry BPE (trained once per session)."""
    from background import tiny_tokens

    return tiny_tokens()


# ---- the longest fixtures, computed beside the suite (tests/background.py) --------------------------------------
_BACKGROUND: list = []


@pytest.hookimpl(trylast=True)  # after -m / -k deselected what will not run
def pytest_collection_modifyitems(config, items):
    """Start one background process for the jobs the selected tests name (``@pytest.mark.background("job")``) and
    run those tests last, by when their jobs have long finished."""
    names = list(dict.fromkeys(m.args[0] for item in items for m in item.iter_markers("background")))
    if not names or config.option.collectonly:
        return
    from background import Background

    _BACKGROUND.append(Background(Path(tempfile.mkdtemp(prefix="plelab-background-")), names))
    items.sort(key=lambda item: item.get_closest_marker("background") is not None)  # stable: the rest keep order


@pytest.fixture(scope="session")
def background():
    """``background(name)``: the folder of a finished background job (the test must be marked with its name)."""
    def result(name: str) -> Path:
        if not _BACKGROUND:
            raise RuntimeError(f"no background process: mark the test @pytest.mark.background({name!r})")
        return _BACKGROUND[0].result(name)
    return result


# ---- the malformed-input suite's count (tests/test_malformed_inputs*.py::test_malformed_input) -----------------
_MALFORMED: dict[str, str] = {}


def pytest_runtest_logreport(report):
    if not re.search(r"test_malformed_inputs(_\d+)?\.py::test_malformed_input\[", report.nodeid):
        return
    if hasattr(report, "wasxfail"):
        outcome = "xpassed" if report.passed else "xfailed"
    elif report.when == "call" or not report.passed:
        outcome = "error" if report.failed and report.when != "call" else report.outcome
    else:
        return
    if _MALFORMED.get(report.nodeid) in (None, "passed"):  # a teardown error after a pass still counts as an error
        _MALFORMED[report.nodeid] = outcome


def pytest_terminal_summary(terminalreporter):
    for bg in _BACKGROUND:
        terminalreporter.write_line(bg.summary())
    if _MALFORMED:
        counts: dict[str, int] = {}
        for outcome in _MALFORMED.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        shown = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        terminalreporter.write_line(f"malformed-input suite: {len(_MALFORMED)} cases, {shown}")


def pytest_unconfigure(config):
    for bg in _BACKGROUND:
        bg.stop()
        shutil.rmtree(bg.root, ignore_errors=True)
