"""Finding and streaming a per-layer table: from a plelab run, a plelab checkpoint, or any
safetensors file / folder holding an HF Gemma 3n / Gemma 4 ``embed_tokens_per_layer.weight``.

Tables are read in row chunks through ``safetensors.safe_open(...).get_slice`` (memory-mapped),
so a Gemma-3n-E2B table (262,144 × 7,680) never has to fit in memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from plelab.config.schema import RunConfig
from plelab.errors import PlelabError
from plelab.model.loading import tensor_location
from plelab.model.tables import table_view
from plelab.training.checkpoint import list_checkpoints, model_file, read_state

TABLE_SUFFIX = "embed_tokens_per_layer.weight"
CHUNK_BYTES = 64 * 2**20


@dataclass
class TableSource:
    """Where a table lives and how to read it. ``config``/``step`` are known for plelab runs only."""

    file: Path
    key: str
    rows: int
    num_layers: int
    dim: int
    config: RunConfig | None = None
    step: int | None = None
    run_dir: Path | None = None
    checkpoint: Path | None = None
    monitor: dict | None = None  # monitor.json of a folder plelab.Monitor wrote (W_0, counts and use are there)

    def chunks(self, chunk_rows: int | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield ``(first_row, rows [r, L, dP] float32)`` over the whole table.

        Rows are read with plain file reads at the offsets in the safetensors header (no mmap),
        so the process holds one chunk at a time: memory stays bounded by the chunk size
        whatever the table size.
        """
        chunk_rows = chunk_rows or max(1, CHUNK_BYTES // (4 * self.num_layers * self.dim))
        start, dtype, _ = tensor_location(self.file, self.key)
        row_bytes = torch.tensor([], dtype=dtype).element_size() * self.num_layers * self.dim
        with open(self.file, "rb") as f:
            for r0 in range(0, self.rows, chunk_rows):
                n = min(chunk_rows, self.rows - r0)
                f.seek(start + r0 * row_bytes)
                raw = np.fromfile(f, dtype=np.uint8, count=n * row_bytes)
                if raw.size != n * row_bytes:
                    raise PlelabError(f"{self.file} is truncated (table {self.key} ends early); re-copy the file")
                block = torch.from_numpy(raw).view(dtype).to(torch.float32, copy=True)
                yield r0, block.view(n, self.num_layers, self.dim)

    def load(self) -> torch.Tensor:
        """The whole table as ``[Vp, L, dP]`` float32 (for CPU-sized tables)."""
        return torch.cat([c for _, c in self.chunks()])


def _open_keys(file: Path) -> tuple[list[str], dict]:
    try:
        with safe_open(str(file), framework="pt") as f:
            return list(f.keys()), {k: f.get_slice(k).get_shape() for k in f.keys()}
    except (SafetensorError, OSError) as err:
        why = (str(err).splitlines() or [repr(err)])[0]
        raise PlelabError(f"{file} is not a readable safetensors file ({why})") from None


def _hf_dims(folder: Path) -> tuple[int | None, int | None]:
    cfg_path = folder / "config.json"
    if not cfg_path.exists():
        return None, None
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError):
        raise PlelabError(f"{cfg_path} is not valid JSON; fix it or pass --num-layers and --dp") from None
    text = cfg.get("text_config") or cfg if isinstance(cfg, dict) else {}
    if not isinstance(text, dict):
        return None, None
    attached = text.get("plelab_ple") if isinstance(text.get("plelab_ple"), dict) else {}  # plelab.attach's entry
    dims = {"num_hidden_layers": text.get("num_hidden_layers"),
            "hidden_size_per_layer_input": text.get("hidden_size_per_layer_input") or attached.get("dim")}
    for key, value in dims.items():
        if value is not None and (type(value) is not int or value < 1):
            raise PlelabError(f"{cfg_path} says {key} = {value!r}, not a positive integer; fix it or pass --num-layers "
                              "and --dp")
    return dims["num_hidden_layers"], dims["hidden_size_per_layer_input"]


def _find_in_safetensors(path: Path) -> tuple[Path, str, tuple]:
    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    index = path / "model.safetensors.index.json" if path.is_dir() else None
    if index is not None and index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError):
            raise PlelabError(f"{index} is not a valid safetensors index") from None
        files = sorted({path / f for k, f in weight_map.items() if k.endswith(TABLE_SUFFIX)}) or files
    if not files:
        raise PlelabError(f"{path} holds no .safetensors file")
    for file in files:
        keys, shapes = _open_keys(file)
        hits = [k for k in keys if k.endswith(TABLE_SUFFIX)]
        if hits:
            return file, hits[0], tuple(shapes[hits[0]])
    raise PlelabError(f"no tensor named '*{TABLE_SUFFIX}' in {path}; is it a Gemma 3n / Gemma 4 or plelab model?")


MONITOR_FILE, MONITOR_TABLE = "monitor.json", "ple_table.safetensors"


def _monitored(p: Path, num_layers: int | None, dp: int | None) -> TableSource | None:
    """The table of a folder :class:`plelab.Monitor` wrote (its run folder or one of its checkpoints), else None."""
    if p.is_dir() and (p / MONITOR_FILE).exists():
        run_dir = p
        found = [c for c in list_checkpoints(p) if (c / MONITOR_TABLE).exists()]
        if not found:
            raise PlelabError(f"{p} has no monitor checkpoint yet; give the Monitor checkpoint_every or call "
                              "monitor.checkpoint(step)")
        ckpt = found[-1]
    elif p.is_dir() and (p / MONITOR_TABLE).exists() and (p.parent.parent / MONITOR_FILE).exists():
        ckpt, run_dir = p, p.parent.parent
    else:
        return None
    try:
        monitor = json.loads((run_dir / MONITOR_FILE).read_text())
        rows, layers, d = (int(x) for x in monitor["shape"])
    except (OSError, ValueError, KeyError, TypeError):
        raise PlelabError(f"{run_dir / MONITOR_FILE} is damaged (no valid shape); it is written by plelab.Monitor"
                          ) from None
    if (num_layers or layers) != layers or (dp or d) != d:
        raise PlelabError(f"--num-layers/--dp disagree with the monitor's table (L={layers}, dP={d}); drop them")
    if monitor.get("kind", "ple") == "ple":
        file, key, shape = _find_in_safetensors(ckpt / MONITOR_TABLE)
    else:  # another kind of the family: its own key, which monitor.json names
        file, key = ckpt / MONITOR_TABLE, str(monitor.get("table_key"))
        keys, shapes = _open_keys(file)
        if key not in keys:
            raise PlelabError(f"{file} holds no tensor {key!r}, which {run_dir / MONITOR_FILE} names; the checkpoint "
                              "is damaged: use another")
        shape = shapes[key]
    if tuple(shape) != (rows, layers * d):
        raise PlelabError(f"{file}: table {key} has shape {list(shape)}, monitor.json says {[rows, layers * d]}")
    return TableSource(file=file, key=key, rows=rows, num_layers=layers, dim=d, step=int(ckpt.name[5:]),
                       run_dir=run_dir, checkpoint=ckpt, monitor=monitor)


def find_table(path: str | Path, num_layers: int | None = None, dp: int | None = None) -> TableSource:
    """Resolve a run folder, a checkpoint folder, a folder plelab.Monitor wrote, or a safetensors file/folder
    to its per-layer table."""
    p = Path(path)
    if not p.exists():
        raise PlelabError(f"{p} does not exist; pass a run folder, a checkpoint folder or a .safetensors file")
    monitored = _monitored(p, num_layers, dp)
    if monitored is not None:
        return monitored
    run_dir = ckpt = None
    cfg = step = None
    if p.is_dir() and (p / "config.json").exists() and (p / "checkpoints").is_dir():
        run_dir = p
        found = list_checkpoints(p)
        if not found:
            raise PlelabError(f"run {p} has no checkpoint yet; train it (checkpoints are written every "
                              "train.checkpoint_every steps)")
        ckpt = found[-1]
    elif p.is_dir() and (p / "state.json").exists():
        ckpt, run_dir = p, p.parent.parent if p.parent.name == "checkpoints" else None
    if ckpt is not None:
        state = read_state(ckpt, for_resume=False)
        try:
            cfg, step = RunConfig.from_dict(state["config"]), int(state["step"])
        except (PlelabError, TypeError, ValueError) as err:
            raise PlelabError(f"{ckpt}/state.json holds no valid config ({err}); the checkpoint is damaged or from "
                              "another plelab version") from None
        view = table_view(cfg.model, cfg.ple, cfg.aux)
        if view is None:
            raise PlelabError(f"{ckpt} is a dP=0 run: it has no per-layer table to diagnose")
        given = [flag for flag, value, own in (("--num-layers", num_layers, cfg.model.num_hidden_layers),
                                               ("--dp", dp, cfg.ple.dim)) if value is not None and value != own]
        if given:
            raise PlelabError(f"{' and '.join(given)} disagree with the run's own config (L="
                              f"{cfg.model.num_hidden_layers}, dP={cfg.ple.dim}); they are for a bare safetensors "
                              "table — drop them for a run or checkpoint folder")
        if view.kind == "ple":
            file, key, shape = _find_in_safetensors(model_file(ckpt))
        else:  # another kind of the family: its table by its own name, read as [rows, layers·dim]
            file, key = model_file(ckpt), view.key
            shape = tuple(_open_keys(file)[1].get(key, ()))
        num_layers, dp = view.layers, view.dim
    else:
        file, key, shape = _find_in_safetensors(p)
        hf_layers, hf_dp = _hf_dims(file.parent) if num_layers is None or dp is None else (None, None)
        num_layers, dp = num_layers or hf_layers, dp or hf_dp
        if num_layers is None or dp is None:
            raise PlelabError(f"{file} has a per-layer table of shape {list(shape)} but no config.json with "
                              "num_hidden_layers and hidden_size_per_layer_input; pass --num-layers and --dp")
    if len(shape) != 2 or shape[1] != num_layers * dp:
        raise PlelabError(f"table {key} has shape {list(shape)}, not [Vp, L·dP] = [Vp, {num_layers}·{dp}]; "
                          "check --num-layers and --dp")
    return TableSource(file=file, key=key, rows=shape[0], num_layers=num_layers, dim=dp, config=cfg, step=step,
                       run_dir=run_dir, checkpoint=ckpt)
