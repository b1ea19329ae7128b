"""Reading tensors of a safetensors file without loading it: where a tensor lies (from the header alone) and a
tensor as a copy-on-write memory map of the file.

The per-layer table is most of a PLE model's bytes and a step reads only the rows of its tokens:
:func:`plelab.training.loading.load_for_eval` maps it from ``model.safetensors`` with :func:`mmap_tensor`, and the
diagnostics stream it in row chunks from the offset :func:`tensor_location` gives.
"""

from __future__ import annotations

import json
import mmap
from pathlib import Path

import torch

from plelab.errors import PlelabError

SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def tensor_location(file: str | Path, key: str) -> tuple[int, torch.dtype, list[int]]:
    """Where tensor ``key`` lies in a safetensors file: ``(byte offset of its data, dtype, shape)``, read from the
    header alone; one-line errors for a missing key, an unsupported dtype or a file cut short."""
    file = Path(file)
    with open(file, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        try:
            entry = json.loads(f.read(header_len))[key]
        except (ValueError, KeyError):
            raise PlelabError(f"{file} has no tensor {key} (or is not a safetensors file)") from None
    dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
    if dtype is None:
        raise PlelabError(f"{key} in {file} has dtype {entry['dtype']}; plelab reads {', '.join(SAFETENSORS_DTYPES)}")
    start, end = entry["data_offsets"]
    if 8 + header_len + end > file.stat().st_size:
        raise PlelabError(f"{file} is truncated ({key} ends past the end of the file); re-copy it")
    return 8 + header_len + start, dtype, entry["shape"]


def mmap_tensor(file: str | Path, key: str) -> torch.Tensor:
    """Tensor ``key`` of a safetensors file as a CPU tensor backed by a copy-on-write memory map."""
    offset, dtype, shape = tensor_location(file, key)
    with open(file, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    count = 1
    for n in shape:
        count *= n
    return torch.frombuffer(buf, dtype=dtype, count=count, offset=offset).view(shape)
