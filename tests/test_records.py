"""Run records: a sweep_dir sweep carried without its weights reads back the same results, resumes without redoing
a run, grows, feeds the scaling fit, and refuses damaged records."""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil

import pytest
from tiny_sweeps import tiny_spec

from plelab import pack
from plelab.cli import main
from plelab.errors import PlelabError
from plelab.sweeps.records import VERSION, read_record, record_path
from plelab.sweeps.results import collect
from plelab.sweeps.runner import jobs_of, run_state, run_sweep
from plelab.scaling.scaling_runs import points_from_runs
from plelab.sweeps.spec import load_spec


def _without_structure(res) -> dict:
    return {arm: {s: json.dumps(dataclasses.asdict(dataclasses.replace(r, structure={})), default=list)
                  for s, r in by_seed.items()} for arm, by_seed in res.runs.items()}


@pytest.mark.slow
def test_a_packed_sweep_reads_back_the_same_results_and_never_reruns(sweep_dir, tmp_path):
    arms = [a.name for a in load_spec(sweep_dir).runnable()]
    n = 2 * len(arms)
    records = sorted((sweep_dir / "records").glob("*/seed-*.json.gz"))
    assert sorted(p.relative_to(sweep_dir).as_posix() for p in records) == sorted(
        f"records/{arm}/seed-{s}.json.gz" for arm in arms for s in (0, 1))
    assert all(p.stat().st_size < 60_000 for p in records)  # no weights
    dest = tmp_path / "carried"
    assert pack(sweep_dir, dest) == {"sweeps": 1, "records": n, "written": 0, "evidence": 0, "held": 0}  # the runner wrote them as runs ended
    assert sorted(p.name for p in dest.iterdir()) == ["records", "sweep.json"]

    here, there = collect(sweep_dir), collect(dest)
    assert not there.missing and _without_structure(here) == _without_structure(there)
    run = there.runs["dp8"][0]
    assert run.final_diag and run.early_diag and run.occurrences["rows_used"] > 0 and run.signal["gate"] is not None
    # the structure test compares the seeds' tables, which a record does not carry
    assert here.runs["dp8"][0].structure and not run.structure

    logs: list[str] = []
    run_sweep(dest, load_spec(dest), progress=False, log=logs.append)
    assert f"{n} already done, 0 to run" in logs[0] and not (dest / "runs").exists()
    logs.clear()
    grown = tiny_spec(arms=[a for a in load_spec(dest).arms if a.name in ("dp0", "dp8")], seeds=[0, 1, 2])
    run_sweep(dest, grown, progress=False, log=logs.append)  # two of its arms, grown by a seed: two runs train
    assert "4 already done, 2 to run" in logs[0]
    assert sorted(p.parent.name + "/" + p.name for p in (dest / "runs").glob("*/seed-*")) == ["dp0/seed-2",
                                                                                             "dp8/seed-2"]
    assert all(run_state(j) == "done" for j in jobs_of(dest, grown))
    assert (dest / "records" / "dp8" / "seed-2.json.gz").is_file()

    def points(where):
        return sorted((p.arm, p.n, p.d, p.loss, p.seed) for p in points_from_runs([where])[0])

    assert [p for p in points(dest) if p[-1] < 2] == points(sweep_dir)  # the fit reads records where folders are gone


@pytest.mark.slow
def test_pack_a_sweep_that_predates_records(sweep_dir, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(sweep_dir, old)
    shutil.rmtree(old / "records")
    r = pack(old, tmp_path / "out")
    n = 2 * len(load_spec(old).runnable())
    assert r == {"sweeps": 1, "records": n, "written": n, "evidence": 0, "held": 0} and (old / "records" / "dp0" / "seed-0.json.gz").is_file()
    assert _without_structure(collect(tmp_path / "out")) == _without_structure(collect(sweep_dir))


@pytest.mark.slow
def test_damaged_records_and_bad_pack_targets_are_one_line_errors(sweep_dir, tmp_path, capsys):
    dest = tmp_path / "carried"
    pack(sweep_dir, dest)
    run = dest / "runs" / "dp8" / "seed-0"
    rec = record_path(run)
    body = read_record(run)
    rec.write_bytes(gzip.compress(json.dumps({**body, "version": VERSION + 1}).encode()))
    with pytest.raises(PlelabError, match="version"):
        read_record(run)
    rec.write_bytes(b"not gzip")
    cases = [(["report", str(dest)], "not a readable run record"),
             (["pack", str(tmp_path / "nowhere"), str(tmp_path / "x")], "holds no plelab sweep"),
             (["pack", str(sweep_dir), str(sweep_dir / "inside")], "inside")]
    for argv, needle in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    assert not (sweep_dir / "inside").exists()

