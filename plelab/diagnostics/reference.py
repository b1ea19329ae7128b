"""What ``plelab diagnose`` compares a table with (``--reference``, ``--null``, ``--null-reference``), checked.

A second seed is the same run with another seed, read at the same point of training:

- given a run folder (plelab's or one :class:`plelab.Monitor` wrote), the checkpoint at the diagnosed checkpoint's
  step is taken, or the nearest one — never silently the latest — and the report's notes say which step was used;
- a comparison whose model (type, hidden size, layers, vocabulary, any other field of ``model.*``), table shape,
  precision (``train.precision``, or the stored table dtype of a checkpoint plelab did not train), corpus
  fingerprint or seed (the same seed is not a second seed) differs is refused in one line naming what differs,
  unless ``allow_mismatch`` is given: then the differences are written into the report's notes.

Tables with other rows (other token ids) are never compared.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from plelab.diagnostics.foreign import hf_config
from plelab.diagnostics.monitor import ATTACH_CONFIG_KEY
from plelab.diagnostics.tables import MONITOR_FILE, MONITOR_TABLE, TableSource, find_table
from plelab.errors import PlelabError
from plelab.model.loading import tensor_location
from plelab.training.checkpoint import list_checkpoints, read_state


def run_checkpoints(path: Path) -> list[Path]:
    """The checkpoint folders of a run folder (plelab's or a Monitor's), oldest first; ``[]`` for anything else."""
    if not path.is_dir():
        return []
    if (path / MONITOR_FILE).exists():
        return [c for c in list_checkpoints(path) if (c / MONITOR_TABLE).exists()]
    if (path / "config.json").exists() and (path / "checkpoints").is_dir():
        return list_checkpoints(path)
    return []


def _find(path: str | Path, like: TableSource) -> TableSource:
    """A table by its own config; a bare table without one is read with ``like``'s L and dP."""
    try:
        return find_table(path)
    except PlelabError:
        if like.config is not None or like.monitor is not None:
            raise
        return find_table(path, like.num_layers, like.dim)


def at_step(path: str | Path, like: TableSource, what: str) -> tuple[TableSource, str | None]:
    """``path``'s table at ``like``'s step: a run folder's checkpoint at that step or the nearest (ties: the
    earlier), anything else as given; with the note that says which step was compared (None when no step is
    known)."""
    step = like.step
    found = run_checkpoints(Path(path)) if step is not None else []
    if not found:
        other = _find(path, like)
        if step is None or other.step is None:
            return other, None
        if other.step == step:
            return other, f"{what} {path}: step {step}, the same as this checkpoint"
        return other, (f"{what} {path} is at step {other.step}, this checkpoint at step {step}: they are compared at "
                       "different points of training")
    steps = [int(c.name[5:]) for c in found]
    best = min(range(len(found)), key=lambda i: (abs(steps[i] - step), steps[i]))
    other = find_table(found[best])
    if other.step == step:
        latest = "" if steps[-1] == step else f", not its latest (step {steps[-1]})"
        return other, f"{what} {path}: its checkpoint at step {step}, the same as this checkpoint{latest}"
    return other, (f"{what} {path} has no checkpoint at step {step}: the nearest, step {other.step}, was compared "
                   f"(it has steps {', '.join(map(str, steps))})")


def describe(source: TableSource) -> dict[str, object]:
    """What a table's run must share with a second seed, ``{name: value}`` (None: not known for this kind)."""
    shape = [source.rows, source.num_layers, source.dim]
    if source.config is not None:
        cfg = source.config
        state = read_state(source.checkpoint, for_resume=False)
        model = dataclasses.asdict(cfg.model)
        out = {"model type": "plelab", "hidden size": model.pop("hidden_size"),
               "layers": model.pop("num_hidden_layers"), "vocab": model.pop("vocab_size"), "table shape": shape,
               **{f"model.{k}": v for k, v in model.items()}, "train.precision": cfg.train.precision,
               "corpus fingerprint": state.get("corpus_fingerprint"), "seed": cfg.seed}
        return out
    if source.monitor is not None:
        return {"hidden size": source.monitor.get("hidden_size"), "table shape": shape,
                "table dtype": source.monitor.get("table_dtype")}
    text = hf_config(source)
    attached = text.get(ATTACH_CONFIG_KEY) if isinstance(text.get(ATTACH_CONFIG_KEY), dict) else {}
    dtype = str(tensor_location(source.file, source.key)[1]).removeprefix("torch.")
    kind = attached.get("host_model_type") or text.get("model_type")  # an attached folder's host, not its wrapper
    return {"model type": kind, "hidden size": text.get("hidden_size"),
            "layers": text.get("num_hidden_layers"), "vocab": text.get("vocab_size"), "table shape": shape,
            "table dtype": dtype, "seed": attached.get("seed")}


def _show(name: str, value: object) -> str:
    return f"{value[:12]}…" if name == "corpus fingerprint" and isinstance(value, str) else str(value)


def differences(a: TableSource, b: TableSource, second_seed: bool = True) -> list[str]:
    """What differs between two tables' runs (``"name A vs B"``), and (``second_seed``) a shared seed; ``[]`` when
    they are a seed pair of one configuration."""
    da, db = describe(a), describe(b)
    out = []
    for name, value in da.items():
        other = db.get(name)
        if name == "seed":
            if second_seed and value is not None and value == other:
                out.append(f"the same seed ({value}: not a second seed)")
        elif value is not None and other is not None and value != other:
            out.append(f"{name} {_show(name, value)} vs {_show(name, other)}")
    return out


def checked(path: str | Path, like: TableSource, what: str, allow_mismatch: bool, notes: list[str],
            second_seed: bool = True) -> TableSource:
    """``path``'s table to compare with ``like`` (:func:`at_step`), refused in one line when its run is not a seed
    pair of ``like``'s (:func:`differences`; ``second_seed=False`` for a matched null run, which shares the seed)
    unless ``allow_mismatch``; what was compared goes into ``notes``."""
    other, note = at_step(path, like, what)
    if note is not None:
        notes.append(note)
    if other.rows != like.rows:
        raise PlelabError(f"{what} {path} has {other.rows:,} table rows, this checkpoint {like.rows:,}: the rows must "
                          "be the same token ids")
    diff = differences(like, other, second_seed)
    if diff and not allow_mismatch:
        wanted, fix = (("a second seed", "the same run trained with another seed") if second_seed else
                       ("a matched null run", "the same run trained with ple.ids=iid"))
        raise PlelabError(f"{what} {path} is not {wanted} of {like.checkpoint or like.file}: {'; '.join(diff)}; give "
                          f"{fix}, or pass --allow-mismatch to compare anyway")
    if diff:
        notes.append(f"--allow-mismatch: {what} {path} differs from this run: {'; '.join(diff)}")
    return other
