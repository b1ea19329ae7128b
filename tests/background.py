"""The suite's longest fixtures, computed in one background process while the other tests run.

Tiny models train bound by Python on one core, so under most tests the 2-core machine's second core sits idle
(BENCHMARKS.md "Test suite"). A test that needs one of :data:`JOBS` is marked ``@pytest.mark.background("name")``;
``conftest.py`` starts one process for the selected jobs when the session starts, runs the marked tests last, and
the fixture :func:`result` waits for its job's folder. Nothing is faked: the job runs the same plelab calls the
test made itself before, in a process set up as the suite's (no bf16 flags, so ``train.precision=auto`` is fp32;
flush-denormal on; its own cache folder), on one torch thread and in the kernel's idle class (``SCHED_IDLE``;
``nice`` 19 where there is none), so that it only ever takes a core the suite leaves idle.

``python tests/background.py ROOT NAME...`` runs the jobs one after another into ``ROOT/NAME``; each writes
``ROOT/NAME.done`` (its wall and CPU seconds) when it finished, or ``ROOT/NAME.failed`` with its traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

WAIT_S = 3600  # the longest a fixture waits: the jobs take ≈ 3–4 min on the project's 2-core machine


def quick_calibration(out: Path) -> None:
    """``plelab calibrate --quick`` with the n-gram kind (``tests/test_calibration.py``)."""
    from plelab.cli import main

    assert main(["calibrate", "--quick", "--kinds", "ngram", "--out", str(out / "bench"), "--no-progress"]) == 0


VERDICT_STEPS = 300


def tiny_tokens():
    """The embedded corpus tokenised with a 512-entry BPE (conftest's session fixture ``tiny_data`` too)."""
    from plelab.data import get_tokenizer, load_corpus, prepare_tokens

    corpus = load_corpus(None)
    return prepare_tokens(corpus, get_tokenizer(corpus, 512, show_progress=False), 0.05)


def verdict_runs(out: Path) -> None:
    """Text PLE keyed by the tokens and by i.i.d. ids, two seeds each (``tests/test_diagnostics_verdict.py``)."""
    from plelab.config import resolve_config
    from plelab.runs import train

    data = tiny_tokens()
    for ids in ("token", "iid"):
        for seed in (0, 1):
            cfg = resolve_config("cpu-tiny", [f"ple.ids={ids}", "train.checkpoint_every=0", "train.eval_every=150",
                                              "train.diag_every=100"], seed=seed, steps=VERDICT_STEPS)
            train(cfg, out / f"{ids}-{seed}", data=data, progress=False, log=lambda *a: None)


ORACLE = ["visual.enabled=true", "visual.scenes=1000", "visual.val_scenes=200", "visual.features=false",
          "train.batch_size=32", "model.num_hidden_layers=4", "train.eval_every=1000", "train.diag_every=0",
          "train.warmup_steps=10", "train.checkpoint_every=0"]


def visual_oracle(out: Path) -> None:
    """The visual positive control: random and oracle ids, features withheld, 300 steps
    (``tests/test_visual_train.py``); writes ``results.json`` = {ids: {"content": loss, "table": verdicts}}."""
    from plelab.config import resolve_config
    from plelab.runs import make_trainer
    from plelab.visual.data import prepare_visual
    from plelab.visual.diagnostics import end_of_run

    results = {}
    for ids in ("random", "oracle"):
        cfg = resolve_config("cpu-tiny", [*ORACLE, f"visual.ids={ids}"], dp=16, steps=300, seed=0)
        trainer = make_trainer(cfg, prepare_visual(cfg), progress=False, log=lambda *x: None)
        trainer.fit()
        results[ids] = {"content": trainer.task.caption_report(trainer.model)["content"],
                        "table": end_of_run(trainer.task, trainer.model, trainer.step,
                                            trainer.task.table_counts(trainer.row_counts()))["visual"]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results))


JOBS = {"quick_calibration": quick_calibration, "verdict_runs": verdict_runs, "visual_oracle": visual_oracle}


class Background:
    """One background process running ``names`` into ``root``."""

    def __init__(self, root: Path, names: list[str]):
        unknown = sorted(set(names) - set(JOBS))
        if unknown:
            raise ValueError(f"no background job {unknown}: the jobs are {sorted(JOBS)}")
        self.root, self.names = root, names
        self.waited: dict[str, float] = {}
        root.mkdir(parents=True, exist_ok=True)
        self.log = root / "background.log"
        env = {**os.environ, "PLELAB_CACHE": str(root / "cache")}
        with open(self.log, "w") as fh:
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(root), *names],
                                         stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def result(self, name: str) -> Path:
        """``root/name`` once its job is done; fails the test with the job's traceback (or the log) otherwise."""
        import pytest

        if name not in self.names:
            raise ValueError(f"background job {name!r} was not started: mark its test @pytest.mark.background")
        asked = time.monotonic()
        deadline = asked + WAIT_S
        while time.monotonic() < deadline:
            if (self.root / f"{name}.done").exists():
                self.waited.setdefault(name, time.monotonic() - asked)
                return self.root / name
            if (self.root / f"{name}.failed").exists():
                pytest.fail(f"background job {name} failed:\n{(self.root / f'{name}.failed').read_text()}")
            if self.proc.poll() is not None and not (self.root / f"{name}.done").exists():
                pytest.fail(f"the background process exited ({self.proc.returncode}) before {name} finished:\n"
                            + self.log.read_text()[-4000:])
            time.sleep(0.5)
        pytest.fail(f"background job {name} not done after {WAIT_S} s:\n" + self.log.read_text()[-4000:])

    def summary(self) -> str:
        """One line: each job's own seconds and how long its tests waited for it."""
        parts = []
        for name in self.names:
            done = self.root / f"{name}.done"
            if done.exists():
                wall, cpu = (float(x) for x in done.read_text().split())
                took = f"{wall:.0f} s ({cpu:.0f} s of CPU)"
            else:
                took = "not finished"
            wait = f", waited {self.waited[name]:.0f} s" if name in self.waited else ""
            parts.append(f"{name} {took}{wait}")
        return f"background jobs (idle priority, beside the suite): {'; '.join(parts)}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def _run(root: Path, names: list[str]) -> int:
    import torch

    import plelab.precision
    import plelab.runtime

    # the idle class: the job takes a core only while the suite leaves it idle, and a suite thread that wakes takes
    # it back at once. At equal priority its busy core stalls the suite's two-thread runs, whose threads wait at
    # each barrier for the other; at nice 19 still by a time slice now and then (bench/cores_beside.py, a tiny
    # 2-thread loop: 6.6x slower beside a 1-thread process, 1.56x beside it at nice 19, 1.04x beside it idle)
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    else:
        os.nice(19)
    # one thread, also where plelab sets the count from the cores it may use (runtime.setup_torch): two threads of a
    # starved process would spin at each barrier for each other (seen: ≈ 19 min of CPU for ≈ 3 min of work)
    plelab.runtime.available_cores = lambda: 1
    plelab.precision.cpu_bf16_flags = lambda: ()  # as conftest's _no_bf16_flags
    torch.set_flush_denormal(True)
    torch.set_num_threads(1)
    parent = os.getppid()

    def orphaned():  # the suite was killed (its own session keeps this process out of the kill): stop too
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(1)

    threading.Thread(target=orphaned, daemon=True).start()
    failed = 0
    for name in names:
        start, cpu = time.perf_counter(), time.process_time()
        try:
            JOBS[name](root / name)
        except BaseException:  # noqa: BLE001 - written for the waiting test, which fails with it
            (root / f"{name}.failed").write_text(traceback.format_exc())
            failed += 1
        else:
            (root / f"{name}.done").write_text(f"{time.perf_counter() - start:.1f} {time.process_time() - cpu:.1f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(_run(Path(sys.argv[1]), sys.argv[2:]))
