"""Fault injection for crash tests: ``PLELAB_FAULT=POINT:STEP`` SIGKILLs the process at that point.

Points: ``after_step`` (right after optimizer step STEP, before any checkpoint of it),
``mid_checkpoint`` (while checkpoint STEP is being written: weights on disk, the rest not) and
``ingest_batch`` (after batch STEP of a streaming ingest is written to its temporary shards).
Unset in normal use; the kill is a real ``kill -9`` of this process.
"""

from __future__ import annotations

import os
import signal


def maybe_fault(point: str, step: int) -> None:
    if os.environ.get("PLELAB_FAULT") == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
