"""A sweep as cluster scripts: one ``torchrun`` line per unfinished run (``commands.sh``) or a Slurm array
(``sweep.sbatch``); with ``nodes > 1`` each run spans that many nodes (torchrun's c10d rendezvous on the first node
of the allocation). Every line is the same ``plelab train --out RUN --resume`` the local runner uses."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from plelab.errors import PlelabError
from plelab.io import atomic_write, umask
from plelab.sweeps.runner import RunJob, prepare_runs, run_state, sweep_lock
from plelab.sweeps.spec import SweepSpec

#: the rendezvous of a multi-node run: torchrun on every node of the allocation meets on its first node
RDZV = ("--nnodes=${NNODES} --nproc_per_node=${NPROC:-1} --rdzv_backend=c10d "
        "--rdzv_endpoint=${MASTER_ADDR}:${MASTER_PORT:-29500} --rdzv_id=${RDZV_ID:-plelab}")


def torchrun_line(job: RunJob, nodes: int = 1) -> str:
    """The run's command under torchrun: ``--standalone`` on one node; on several, the c10d rendezvous flags
    (:data:`RDZV`: ``NNODES``, ``NPROC``, ``MASTER_ADDR``, ``MASTER_PORT``, ``RDZV_ID`` from the environment)."""
    args = ["train", "--out", str(job.path.resolve()), "--resume", "--no-progress"]
    where = "--standalone --nproc_per_node=${NPROC:-1}" if nodes == 1 else RDZV
    return f"torchrun {where} -m plelab " + " ".join(shlex.quote(a) for a in args)


def _slurm_script(lines: list[str], nodes: int) -> str:
    head = ["#!/usr/bin/env bash", "#SBATCH --job-name=plelab-sweep", f"#SBATCH --array=0-{max(0, len(lines) - 1)}",
            "#SBATCH --output=slurm-%A_%a.out"]
    if nodes == 1:
        head += ["#SBATCH --gpus-per-task=1",
                 "# One array task per unfinished run; each resumes from its own checkpoints if requeued.",
                 "set -euo pipefail", "NPROC=${SLURM_GPUS_ON_NODE:-1}"]
        run = 'eval "${RUNS[$SLURM_ARRAY_TASK_ID]}"'
    else:
        head += [f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive",
                 f"# One array task per unfinished run, each on {nodes} nodes (one torchrun per node, all GPUs of the",
                 "# node); each resumes from its own checkpoints if requeued. The run folders must be on a filesystem",
                 "# every node sees (sharded checkpoints: each rank writes its own file).",
                 "set -euo pipefail", "export NNODES=$SLURM_NNODES NPROC=${SLURM_GPUS_ON_NODE:-1}",
                 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                 "export MASTER_PORT=${MASTER_PORT:-29500} RDZV_ID=$SLURM_JOB_ID-$SLURM_ARRAY_TASK_ID"]
        run = 'srun --kill-on-bad-exit=1 bash -c "${RUNS[$SLURM_ARRAY_TASK_ID]}"'
    return "\n".join(head) + "\nRUNS=(\n" + "".join(f"  {shlex.quote(line)}\n" for line in lines) + ")\n" + run + "\n"


def emit_scripts(root: Path, spec: SweepSpec, kind: str, nodes: int = 1) -> Path:
    """Write ``commands.sh`` (one torchrun line per unfinished run) or ``sweep.sbatch`` (a Slurm array; ``nodes``
    per run)."""
    if kind not in ("torchrun", "slurm"):
        raise PlelabError(f"--emit {kind!r}: choose torchrun or slurm")
    if nodes < 1:
        raise PlelabError(f"--nodes must be >= 1, got {nodes}")
    with sweep_lock(root):
        jobs = [j for j in prepare_runs(root, spec) if run_state(j) != "done"]
    if not jobs:
        raise PlelabError(f"every run of {root} is done: nothing to emit; plelab report {root} writes the report")
    lines = [torchrun_line(j, nodes) for j in jobs]
    if kind == "torchrun":
        note = ("# One line per unfinished run; set NPROC to the GPUs per run.\n" if nodes == 1 else
                f"# One line per unfinished run, to start on each of its {nodes} nodes with NNODES={nodes}, NPROC\n"
                "# (GPUs per node), MASTER_ADDR (the first node), MASTER_PORT and RDZV_ID set alike on all of them.\n")
        body = "#!/usr/bin/env bash\n" + note + "set -euo pipefail\n" + "\n".join(lines) + "\n"
        path = Path(root) / "commands.sh"
    else:
        body = _slurm_script(lines, nodes)
        path = Path(root) / "sweep.sbatch"
    atomic_write(path, lambda p: p.write_text(body))
    os.chmod(path, 0o777 & ~umask())  # executable, readable as the umask implies
    return path
