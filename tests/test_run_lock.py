"""One process writes a run folder at a time (issue 54 item 11), and a sweep killed with ``kill -9`` leaves no worker
training on into a folder its rerun writes: the per-run lock (:mod:`plelab.locks`) and each worker's watch on its
sweep."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from malformed import refused, snapshot

from plelab.cli import main
from plelab.locks import PARENT_ENV, RUN_LOCK, FolderBusy, FolderLock, ParentWatch
from plelab.training import checkpoint as ckpt

_HOLD = ("import sys, time\nfrom plelab.locks import FolderLock\nlock = FolderLock.acquire(sys.argv[1])\n"
         "print('held', flush=True)\ntime.sleep(600)")


def _pid_in(lock_file: Path) -> int:
    return json.loads(lock_file.read_text())["pid"]


def test_a_second_process_is_refused_naming_the_holder_and_a_dead_holder_never_blocks(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(run)
        with pytest.raises(FolderBusy) as err:
            FolderLock.acquire(run)
        assert str(err.value).startswith(f"run folder {run} is in use by another plelab process (PID {holder.pid} on ")
        assert "\n" not in str(err.value) and snapshot(run) == before  # the refused call wrote nothing
        holder.kill()  # kill -9: no chance to remove its lock file
        holder.wait(timeout=60)
    finally:
        holder.kill()
    assert _pid_in(run / RUN_LOCK) == holder.pid  # its file is left behind ...
    lock = FolderLock.acquire(run)  # ... and blocks no one: the kernel dropped the lock with the process
    assert lock is not None and _pid_in(run / RUN_LOCK) == os.getpid()
    with pytest.raises(FolderBusy, match=f"PID {os.getpid()} on .*: this process, whose earlier trainer"):
        FolderLock.acquire(run)  # one lock per folder in a process too
    lock.release()
    assert not (run / RUN_LOCK).exists()  # a holder that lets go leaves the folder as it found it
    lock.release()  # idempotent


def test_a_lock_file_removed_as_it_is_taken_is_not_trusted(tmp_path, monkeypatch):
    """The holder lets go (removing the file) between another process's open and its lock: that process holds a
    lock on a file no longer in the folder, sees it, and takes the folder's new file instead."""
    first = FolderLock.acquire(tmp_path)
    real, calls = fcntl.flock, []

    def flock(fh, op):
        if not calls:
            first.release()
        calls.append(op)
        return real(fh, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    second = FolderLock.acquire(tmp_path)
    assert len(calls) == 2  # a second try
    assert os.stat(tmp_path / RUN_LOCK).st_ino == os.fstat(second._fh.fileno()).st_ino
    monkeypatch.undo()
    with pytest.raises(FolderBusy):
        FolderLock.acquire(tmp_path)
    second.release()


def test_the_parent_watch(monkeypatch):
    monkeypatch.delenv(PARENT_ENV, raising=False)
    assert ParentWatch.from_env() is None
    monkeypatch.setenv(PARENT_ENV, "not a pid")
    assert ParentWatch.from_env() is None
    monkeypatch.setenv(PARENT_ENV, str(os.getppid()))
    watch = ParentWatch.from_env()
    assert watch.direct and not watch.gone()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    far = ParentWatch(child.pid)  # not this process's parent: asked whether it is alive
    assert not far.direct and far.gone()
    assert not ParentWatch(os.getpid()).gone()


def _workers(root: Path) -> dict[int, Path]:
    """The live ``plelab train`` processes of the sweep in ``root``: PID -> run folder (read from /proc)."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError, ValueError):
            continue
        args = [a.decode() for a in args]
        if proc.name.isdigit() and "train" in args and "--out" in args and state != "Z":
            out = Path(args[args.index("--out") + 1])
            if str(out).startswith(str(root)):
                found[int(proc.name)] = out
    return found


def _alive(pid: int) -> bool:
    """Whether any thread of ``pid`` is still there (a killed process's leader turns zombie before its other threads
    have exited, and its files, locks included, are closed only with the last one)."""
    for task in (Path("/proc") / str(pid) / "task").glob("*"):
        try:
            if (task / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                return True
        except (OSError, IndexError):
            continue
    return False


def _steps(run: Path) -> list[int]:
    try:
        return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if x.endswith("}")]
    except OSError:
        return []


def _wait(what: str, until, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not until():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads the process table from /proc")
def test_a_sweep_killed_with_kill_9_leaves_no_worker_training_and_its_rerun_cannot_write_with_them(
        tmp_path, tiny_data, capsys):
    """The sweep is killed with -9 while its two workers are stopped (SIGSTOP: they cannot notice anything). Its
    rerun's workers and a ``plelab train --resume`` are refused, naming the orphan, writing nothing; an orphan killed
    with -9 blocks no one; the other, continued, notices its sweep is gone and stops with a checkpoint of its step."""
    root = tmp_path / "sw"
    cmd = [sys.executable, "-m", "plelab", "sweep", "--preset", "cpu-tiny", "--dp", "0,8", "--seeds", "1",
           "--steps", "100000", "--out", str(root), "--no-report", "--no-progress", "--jobs", "2",
           "--set", "train.checkpoint_every=100000", "--set", "train.eval_every=100000",
           "--set", "train.diag_windows=0"]
    sweep = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait("two workers training", lambda: len(_workers(root)) == 2 and all(
            len(_steps(run)) >= 2 for run in _workers(root).values()) or sweep.poll() is not None)
        workers = {run: pid for pid, run in _workers(root).items()}
        assert len(workers) == 2, "the sweep never started its two workers"
        for pid in workers.values():
            os.kill(pid, signal.SIGSTOP)
        os.kill(sweep.pid, signal.SIGKILL)  # the sweep alone: its workers live on, orphaned
        sweep.wait(timeout=60)
        (a, pid_a), (b, pid_b) = sorted(workers.items())
        before = {run: {k: v for k, v in snapshot(run).items() if k != "train.log"} for run in workers}

        rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert rerun.returncode == 2 and "2 run(s) failed" in rerun.stderr, rerun.stderr[-2000:]
        for run, pid in workers.items():
            last = (run / "train.log").read_text().strip().splitlines()[-1]
            assert last.startswith(f"plelab: error: run folder {run} is in use by another plelab process (PID {pid} "
                                   "on "), last
            assert {k: v for k, v in snapshot(run).items() if k != "train.log"} == before[run]  # nothing written
        line = refused(["train", "--out", str(a), "--resume", "--no-progress"],
                       f"is in use by another plelab process (PID {pid_a} on ", a, capsys)
        assert str(a) in line

        os.kill(pid_a, signal.SIGKILL)  # an orphan killed with -9 leaves its lock file, which blocks no one
        _wait("the killed orphan to go", lambda: not _alive(pid_a), 60)
        assert _pid_in(a / RUN_LOCK) == pid_a
        assert main(["train", "--out", str(a), "--resume", "--steps", "2", "--set", "train.early_checkpoint=0",
                     "--no-progress"]) == 0
        assert not (a / RUN_LOCK).exists()

        os.kill(pid_b, signal.SIGCONT)  # the other orphan goes on: at its next step it finds its sweep gone
        _wait("the orphan to stop by itself", lambda: not _alive(pid_b), 60)
        last = (b / "train.log").read_text().strip().splitlines()[-1]
        assert last.startswith(f"plelab: error: the sweep that started this run (PID {sweep.pid}) is gone: {b} "
                               "stopped at step "), last
        latest = ckpt.latest_intact(b, lambda *x: None)
        assert latest is not None and ckpt.read_state(latest)["step"] == _steps(b)[-1]  # resumable where it stopped
        assert not (b / RUN_LOCK).exists()
    finally:  # whatever failed above, nothing of this test trains on
        sweep.kill()
        for pid in _workers(root):
            os.kill(pid, signal.SIGKILL)


def test_a_second_sweep_on_one_folder_is_refused_naming_the_holder(tmp_path):
    from plelab.sweeps.runner import sweep_lock

    with sweep_lock(tmp_path):
        code = ("import sys; from pathlib import Path; from plelab.sweeps.runner import sweep_lock\n"
                "with sweep_lock(Path(sys.argv[1])): pass\n")
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
        assert out.returncode != 0 and "sweep folder" in out.stderr and f"PID {os.getpid()}" in out.stderr
    assert not (tmp_path / ".lock").exists()  # let go: the file goes with it
    with sweep_lock(tmp_path):  # and the folder can be taken again
        pass


def test_only_rank_0_asks_the_lock_before_a_torchrun_start(tmp_path, monkeypatch):
    """Every torchrun rank runs ``check_start`` before the process group exists; only rank 0 (the rank that holds the
    folder) may probe the lock: ranks probing together saw each other's half-written lock file ("a process that has
    not said its PID yet") and a late rank saw its own rank 0's lock, so a resume under load was refused."""
    from plelab.config import resolve_config
    from plelab.runs import check_start

    cfg = resolve_config("cpu-tiny", [])
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("WORLD_SIZE", "3")
        for rank in ("1", "2"):
            monkeypatch.setenv("RANK", rank)
            check_start(cfg, run, resume=True)  # rank 0 holds it (here: the holder), this rank does not ask
        monkeypatch.setenv("RANK", "0")
        with pytest.raises(FolderBusy, match=f"PID {holder.pid} on "):
            check_start(cfg, run, resume=True)
        monkeypatch.setenv("WORLD_SIZE", "1")  # a single process is rank 0 whatever RANK says
        monkeypatch.setenv("RANK", "1")
        with pytest.raises(FolderBusy, match=f"PID {holder.pid} on "):
            check_start(cfg, run, resume=True)
    finally:
        holder.kill()
        holder.wait(timeout=60)
