"""What every case of the malformed-input suite (``tests/test_malformed_inputs*.py``) must show."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from plelab.cli import main


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``, by relative path."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def refused(argv: list[str], needle: str, root: Path, capsys) -> str:
    """Run ``plelab argv`` in-process: exit code 2, exactly one line on stderr holding ``needle`` (no traceback),
    every file under ``root`` byte-identical after it, no half-written ingest left in the cache. Returns the line."""
    before = snapshot(root)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors exit from inside parse_args
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    assert err.count("\n") == 1 and err.startswith("plelab: error: ") and "Traceback" not in err, err
    assert needle in err, err
    after = snapshot(root)
    changed = [p for p, h in before.items() if after.get(p) != h]
    assert not changed, f"{argv} changed or removed {changed[:3]}"
    assert not list(Path(os.environ["PLELAB_CACHE"]).glob("ingest/.*")), "an ingest left a half-written cache entry"
    return err
