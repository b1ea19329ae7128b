"""A sweep folder's report, chosen by the kind in its ``sweep.json``: the dP study's
(:func:`plelab.reports.sweep.write_report`), a learning-rate search's choice, or one a study registered with
:func:`register_report` (the visual study registers ``visual`` when ``plelab.visual`` is imported)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from plelab.errors import PlelabError
from plelab.io import check_folder_target
from plelab.reports.sweep import write_report
from plelab.sweeps.lr_search import choose, write_choice
from plelab.sweeps.results import collect
from plelab.sweeps.spec import load_spec
from plelab.training.task import load_kind


def _lr_report(root: Path) -> list[Path]:
    """A learning-rate search's choice (``lr.json``, ``lr.md``): :mod:`plelab.sweeps.lr_search`."""
    return write_choice(root, choose(collect(root, structure=False)))


_WRITERS: dict[str, Callable[[Path], list[Path]]] = {"dp": write_report, "lr": _lr_report}


def register_report(kind: str, writer: Callable[[Path], list[Path]]) -> None:
    """``writer(root) -> written paths`` is the report of sweeps of ``kind``."""
    _WRITERS[kind] = writer


def report(sweep: str | Path, delta: float | None = None) -> list[Path]:
    """Write the report of the sweep folder ``sweep`` into ``sweep/report/``; returns the files written.
    ``delta``: a dP study read at another margin than its plan's, a post-hoc sensitivity analysis written to
    ``sweep/report-posthoc-delta-{delta}/`` (:func:`plelab.reports.sweep.write_report`)."""
    root = Path(sweep)
    spec = load_spec(root)
    if spec is None:
        return write_report(root)  # says in one line that this is not a sweep
    load_kind(spec.kind)  # a study of another kind of run: its package registers its report
    if delta is not None:
        if spec.kind != "dp":
            raise PlelabError(f"--delta reads a dP study at another margin; {root} is a '{spec.kind}' sweep — drop "
                              "--delta")
        return write_report(root, delta=delta)
    check_folder_target(root / "report", "report folder", "move it away and rerun plelab report")
    if spec.kind not in _WRITERS:
        raise PlelabError(f"{root} is a '{spec.kind}' sweep and no report is registered for that kind; import the "
                          "package that defines it (or use the plelab command)")
    return _WRITERS[spec.kind](root)

