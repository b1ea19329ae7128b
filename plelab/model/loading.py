"""Reading tensors of a safetensors file without loading it — where a tensor lies (from the header alone), a tensor
as a copy-on-write memory map of the file — and :func:`check_tensors`, the one check every load path makes before
a file's tensors are used.

The per-layer table is most of a PLE model's bytes and a step reads only the rows of its tokens:
:func:`plelab.training.loading.load_for_eval` maps it from ``model.safetensors`` with :func:`mmap_tensor`, and the
diagnostics stream it in row chunks from the offset :func:`tensor_location` gives.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from plelab.errors import PlelabError

SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
# Every dtype a safetensors header may name (what the model expects is checked against these: check_tensors).
HEADER_DTYPES = {**SAFETENSORS_DTYPES, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                 "U8": torch.uint8, "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64, "BOOL": torch.bool,
                 "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


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


def header_specs(file: str | Path) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """``{name: (dtype, shape)}`` of every tensor of a safetensors file, from its header alone (nothing is read);
    one line for a file that is not readable safetensors."""
    try:
        with safe_open(str(file), framework="pt") as f:
            slices = {k: f.get_slice(k) for k in f.keys()}
            dtypes = {k: s.get_dtype() for k, s in slices.items()}
            out = {k: (HEADER_DTYPES.get(dtypes[k]), tuple(s.get_shape())) for k, s in slices.items()}
    except (SafetensorError, OSError) as err:
        raise PlelabError(f"{file} is not a readable safetensors file ({(str(err).splitlines() or [repr(err)])[0]})"
                          ) from None
    unknown = [k for k, (dtype, _) in out.items() if dtype is None]
    if unknown:
        raise PlelabError(f"{file}: {unknown[0]} has dtype {dtypes[unknown[0]]}, which plelab does not read")
    return out


def _spec(t) -> tuple[torch.dtype, tuple[int, ...] | None]:
    """``(dtype, shape)`` of a tensor (real, meta or memory-mapped) or of a ``(dtype, shape)`` pair (shape ``None``:
    any shape)."""
    return (t.dtype, tuple(t.shape)) if isinstance(t, torch.Tensor) else (t[0], None if t[1] is None else tuple(t[1]))


def _kind(dtype: torch.dtype) -> str:
    return ("bool" if dtype == torch.bool else "complex" if dtype.is_complex
            else "float" if dtype.is_floating_point else "integer")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_tensors(where: str, found: Mapping, expected: Mapping, fix: str, *, exact_dtype: bool = True,
                  complete: bool = True, extra: bool = False) -> None:
    """Refuse, in one line ending in ``fix``, tensors ``found`` in a file (``where``) that are not what the model
    ``expected`` — before any of them is used. Values: tensors or ``(dtype, shape)`` pairs, by name (an expected
    shape ``None``: a tensor whose shape varies, e.g. a log that grows with the run).

    Why: a safetensors header is trusted by the reader, and a copy into a parameter converts dtypes silently, so
    a float weight relabelled ``I32`` in the header loads as ~1e9-sized garbage (a resumed run trains on it and
    its checkpoints replace the intact ones). Each name in both must have the expected shape and dtype
    (``exact_dtype``: the same dtype, for plelab's own checkpoints, which hold the model's dtypes; otherwise the
    same kind — float, integer, bool —, for HF folders, which may hold bf16 for a float32 model). ``complete``:
    every expected name must be found; ``extra``: names the model does not have are allowed.
    """
    wrong = ([f"missing {n}" for n in sorted(expected) if n not in found] if complete else []) + (
        [] if extra else [f"unexpected {n}" for n in sorted(found) if n not in expected])
    if wrong:
        raise PlelabError(f"{where} does not fit this model ({wrong[0]}); {fix}")
    for name in (n for n in found if n in expected):
        (dtype, shape), (want_dtype, want_shape) = _spec(found[name]), _spec(expected[name])
        same = dtype == want_dtype if exact_dtype else _kind(dtype) == _kind(want_dtype)
        if not same:
            raise PlelabError(f"{where}: {name} is stored as {_name(dtype)}, the model expects {_name(want_dtype)} — "
                              f"its header was altered or the file is not this model's; {fix}")
        if want_shape is not None and shape != want_shape:
            raise PlelabError(f"{where} does not fit this model: {name} has shape {shape}, the model expects "
                              f"{want_shape} (another config); {fix}")
