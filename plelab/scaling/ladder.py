"""``plelab plan --target PRESET --tokens N``: a ladder of model sizes from a CPU-affordable rung to the target.

Rules (each printed with the ladder):

- **Width** halves from the target's ``H`` down to ``min_hidden``. The number of heads is held, so
  ``head_dim`` scales with ``H``; the FFN ratio ``F/H`` is held (``F`` rounded to a multiple of 8).
- **Depth**: ``depth="scaled"`` holds the aspect ratio ``H/L`` (``L = max(2, round(L·H_k/H))``);
  ``depth="fixed"`` holds ``L``.
- **dP/H** is held (``dP = max(1, round(dP·H_k/H))``); each rung's sweep crosses the seed's ratios
  ``dP/H ∈ dp_ratios`` (0.025 → 0.05 is the seed's dead zone).
- **Vocabulary**: ``vocab="scaled"`` holds ``V/H`` (``V`` rounded to a multiple of 64, at least 512) and the
  table keeps one row per id; ``vocab="fixed"`` keeps the target's tokenizer at every rung.
- **Tokens per parameter** are held: ``D_k = (D / N) · N_k``, ``N`` the trunk's parameters (PLE excluded)
  with embeddings (``count="total"``, how the seed counts its 2,458,421,760) or without
  (``count="non-embedding"``). Tokens per table row ``D_k / V_p`` then drift, and the ladder says by how much.

Per rung: exact parameters (:func:`plelab.model.accounting.account`), tokens, training FLOPs (6·N_matmul +
attention, per token), estimated GPU-hours at ``mfu`` of the named GPU's dense bf16 peak, CPU-hours at a
stated sustained CPU rate, memory per device (:func:`device_memory`), and the ``plelab sweep`` command.
"""

from __future__ import annotations

import dataclasses
import math

from plelab.config import get_preset
from plelab.config.schema import ModelConfig, PLEConfig, RunConfig
from plelab.errors import ConfigError
from plelab.model.accounting import account

# Dense (no sparsity) bf16 tensor-core peaks, FLOP/s, from NVIDIA's datasheets: A100 SXM 312 TFLOPS; H100 SXM and
# H200 SXM 989 TFLOPS (the datasheets print 1,979 "with sparsity").
GPU_BF16_PEAK = {"a100": 312e12, "h100": 989e12, "h200": 989e12}
GPU_MEMORY_GIB = {"a100": 80, "h100": 80, "h200": 141}
SEED_DP_RATIOS = (0.025, 0.05, 0.1, 0.2)  # the seed's dP 64 / 128 / 256 / 512 at H = 2560
CPU_FLOPS = 1.0e11  # sustained training FLOP/s assumed for a 2-core CPU rung (BENCHMARKS.md: ~70% of ~150 GFLOP/s)


@dataclasses.dataclass(frozen=True)
class Assumptions:
    """What the memory and time estimates assume (all printed)."""

    world: int = 8  # data-parallel degree (GPUs)
    fsdp: bool = True  # trunk state sharded over ``world`` (FSDP2); False: DDP replicas
    micro_batch: int = 1  # sequences per device per micro-step
    seq_len: int | None = None  # None: the target preset's train.seq_len
    batch_tokens: int = 1 << 20  # global batch at the target (smaller rungs: at least 2,000 steps)
    mfu: float = 0.4
    gpu: str = "h100"
    cpu_flops: float = CPU_FLOPS
    cpu_budget_hours: float = 24.0


def device_memory(mc: ModelConfig, pc: PLEConfig, groups: dict, a: Assumptions, table: str,
                  checkpointing: bool) -> float:
    """Bytes per device during training. State: fp32 weights (4 B) + fp32 grads (4 B) + AdamW moments (8 B)
    per parameter. The table: ``dense`` as the trunk, both sharded over ``world`` under FSDP; ``row-sparse`` 12 B
    per parameter (sparse grads not counted) and ``host`` nothing on the device — both run under DDP in plelab
    (``train.parallel=ddp``), so with them the trunk is replicated. Activations (bf16, fused attention):
    ``34·T·b·H`` bytes per layer (Korthikanti et al. 2022, arXiv:2205.05198, without the ``5·a·T²·b`` term that
    fused attention removes) plus
    the PLE branch's ``8·T·b·dP``; with activation checkpointing, the layer inputs ``2·T·b·H`` per layer plus one
    layer recomputed in full. The chunked LM-head loss keeps the logits out of the count."""
    table_params = groups.get("ple_table", 0)
    trunk = sum(groups.values()) - table_params
    shard = a.world if a.fsdp and table == "dense" else 1
    state = 16 * trunk / shard
    state += {"dense": 16 * table_params / shard, "row-sparse": 12 * table_params, "host": 0}[table]
    T, b, H, L = a.seq_len, a.micro_batch, mc.hidden_size, mc.num_hidden_layers
    per_layer = 34 * T * b * H + (8 * T * b * pc.dim if pc.enabled else 0)
    acts = (2 * T * b * H * L + per_layer) if checkpointing else per_layer * L
    return state + acts


def _rung_model(mc: ModelConfig, pc: PLEConfig, hidden: int, depth: str, vocab: str) -> tuple[ModelConfig,
                                                                                              PLEConfig] | None:
    scale = hidden / mc.hidden_size
    nq = mc.num_attention_heads
    if hidden % nq or (hidden // nq) % 2:
        return None  # head_dim must be an even integer (RoPE rotates pairs)
    layers = mc.num_hidden_layers if depth == "fixed" else max(2, round(mc.num_hidden_layers * scale))
    V = mc.vocab_size if vocab == "fixed" else max(512, round(mc.vocab_size * scale / 64) * 64)
    m = dataclasses.replace(mc, hidden_size=hidden, head_dim=hidden // nq, num_hidden_layers=layers,
                            intermediate_size=max(8, round(mc.intermediate_size * scale / 8) * 8), vocab_size=V)
    rows = pc.vocab_size if vocab == "fixed" else None
    return m, dataclasses.replace(pc, dim=max(1, round(pc.dim * scale)), vocab_size=rows)


def _n(acc, count: str) -> int:
    return acc.base - (acc.groups["embed_tokens"] + acc.groups["lm_head"] if count == "non-embedding" else 0)


def ladder(target: str | RunConfig, tokens: float, assumptions: Assumptions = Assumptions(), min_hidden: int = 128,
           depth: str = "scaled", vocab: str = "scaled", count: str = "total",
           dp_ratios: tuple[float, ...] = SEED_DP_RATIOS, emit: str = "torchrun", seeds: int = 3) -> dict:
    """The ladder as a JSON-ready dict with a list of ``rungs``, smallest first (see the module docstring)."""
    cfg = get_preset(target) if isinstance(target, str) else target
    name = cfg.preset if isinstance(target, RunConfig) else target
    if not tokens or not math.isfinite(tokens) or tokens <= 0:
        raise ConfigError(f"--tokens must be a positive number of training tokens, e.g. 400e9; got {tokens!r}")
    if not cfg.ple.enabled:
        raise ConfigError(f"preset {name} has no per-layer table (ple.dim=0): a ladder plans a PLE study; choose a "
                          "preset with PLE or --set ple.dim=…")
    if assumptions.gpu not in GPU_BF16_PEAK:
        raise ConfigError(f"unknown --gpu {assumptions.gpu!r}: choose one of {', '.join(GPU_BF16_PEAK)}")
    if not 0 < assumptions.mfu <= 1:
        raise ConfigError(f"--mfu must be in (0, 1], got {assumptions.mfu}")
    for key, value in (("depth", depth), ("vocab", vocab)):
        if value not in ("fixed", "scaled"):
            raise ConfigError(f"--{key} must be fixed or scaled, got {value!r}")
    if count not in ("total", "non-embedding"):
        raise ConfigError(f"--count must be total or non-embedding, got {count!r}")
    mc, pc = cfg.model, cfg.ple
    a = dataclasses.replace(assumptions, seq_len=assumptions.seq_len or cfg.train.seq_len)
    top = account(mc, pc, a.seq_len)
    per_param = tokens / _n(top, count)
    widths, h = [], mc.hidden_size
    while h >= min_hidden:
        widths.append(h)
        if h % 2:
            break
        h //= 2
    rungs = []
    for hidden in reversed(widths):
        shape = (mc, pc) if hidden == mc.hidden_size else _rung_model(mc, pc, hidden, depth, vocab)
        if shape is None:
            continue
        rungs.append(_rung(name, shape[0], shape[1], hidden == mc.hidden_size, per_param, a, count, dp_ratios,
                           emit, seeds))
    affordable = [r for r in rungs if r["cpu_hours"] <= a.cpu_budget_hours]
    return {"target": name, "tokens": tokens, "tokens_per_parameter": per_param, "count": count,
            "depth": depth, "vocab": vocab, "dp_ratios": list(dp_ratios), "assumptions": dataclasses.asdict(a),
            "gpu_peak_flops": GPU_BF16_PEAK[a.gpu], "rungs": rungs,
            "cpu_affordable": [r["hidden_size"] for r in affordable],
            "notes": _notes(rungs, affordable, a, vocab, depth)}


def _rung(name, mc, pc, is_target, per_param, a, count, dp_ratios, emit, seeds) -> dict:
    acc = account(mc, pc, a.seq_len)
    n_total, n_core = acc.base, _n(acc, "non-embedding")
    D = per_param * _n(acc, count)
    flops = acc.flops_per_token * D
    rows = pc.resolved_vocab_size(mc)
    batch = max(a.seq_len, min(a.batch_tokens, int(D // 2000) // a.seq_len * a.seq_len))
    steps = math.ceil(D / batch)
    memory = {f"{t}{'_ckpt' if ck else ''}": device_memory(mc, pc, acc.groups, a, t, ck)
              for t in ("dense", "row-sparse", "host") for ck in (False, True)}
    dps = sorted({0, *(max(1, round(r * mc.hidden_size)) for r in dp_ratios)})
    sets = [] if is_target else [
        f"model.hidden_size={mc.hidden_size}", f"model.head_dim={mc.resolved_head_dim}",
        f"model.num_hidden_layers={mc.num_hidden_layers}", f"model.intermediate_size={mc.intermediate_size}",
        f"model.vocab_size={mc.vocab_size}"] + ([] if pc.vocab_size is None else [f"ple.vocab_size={pc.vocab_size}"])
    cpu = flops / a.cpu_flops / 3600 <= a.cpu_budget_hours
    seqs = batch // a.seq_len
    if cpu:
        sets += [f"train.seq_len={a.seq_len}", f"train.batch_size={seqs}", "train.device=cpu"]
    else:  # a whole number of micro-batches on every device
        per_step = a.world * a.micro_batch
        seqs = max(per_step, round(seqs / per_step) * per_step)
        batch = seqs * a.seq_len
        steps = math.ceil(D / batch)
        sets += [f"train.seq_len={a.seq_len}", f"train.batch_size={seqs}", f"train.grad_accum={seqs // per_step}",
                 "train.device=cuda"] + (["train.parallel=fsdp"] if a.fsdp else [])
    command = (f"plelab sweep --preset {name} " + " ".join(f"--set {s}" for s in sets)
               + f" --dp {','.join(map(str, dps))} --seeds {seeds} --steps {steps} --out runs/ladder-H{mc.hidden_size}"
               + ("" if cpu else f" --emit {emit}"))
    where = "cpu (2 cores)" if cpu else f"{a.world}× {a.gpu.upper()}"
    return {"hidden_size": mc.hidden_size, "num_hidden_layers": mc.num_hidden_layers, "head_dim": mc.resolved_head_dim,
            "intermediate_size": mc.intermediate_size, "vocab_size": mc.vocab_size, "table_rows": rows,
            "dP": pc.dim, "dP_over_H": pc.dim / mc.hidden_size, "params_total": n_total,
            "params_non_embedding": n_core, "ple_added": acc.added, "tokens": D,
            "tokens_per_parameter": D / _n(acc, count), "tokens_per_table_row": D / rows,
            "H_over_L": mc.hidden_size / mc.num_hidden_layers, "train_flops": flops,
            "gpu_hours": flops / (a.mfu * GPU_BF16_PEAK[a.gpu]) / 3600, "cpu_hours": flops / a.cpu_flops / 3600,
            "global_batch_tokens": batch, "steps": steps, "device_memory_bytes": memory, "command": command,
            "runs_on": where, "target": is_target}


def _notes(rungs, affordable, a: Assumptions, vocab: str, depth: str) -> list[str]:
    notes = [f"tokens per table row drift from {rungs[0]['tokens_per_table_row']:,.0f} (smallest rung) to "
             f"{rungs[-1]['tokens_per_table_row']:,.0f} (target): the ladder holds tokens per parameter, not per row "
             "(a smaller ple.vocab_size with ple.vocab_remap=frequency raises a rung's tokens per row without "
             "merging its frequent ids)"]
    if not affordable:
        notes.append(f"no rung trains within {a.cpu_budget_hours:g} CPU-hours at {a.cpu_flops / 1e9:.0f} GFLOP/s"
                     + (" (try --vocab scaled)" if vocab == "fixed" else "")
                     + (" (try --depth scaled)" if depth == "fixed" else "")
                     + "; lower --min-hidden or the tokens")
    if any(r["device_memory_bytes"]["dense"] > GPU_MEMORY_GIB[a.gpu] * 2**30 for r in rungs):
        notes.append(f"some rungs need more than a {a.gpu.upper()}'s {GPU_MEMORY_GIB[a.gpu]} GiB with a dense table "
                     "and no activation checkpointing: see the other memory columns")
    return notes


def _si(x: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.3g}{unit}"
    return f"{x:.3g}"


def ladder_text(p: dict) -> str:
    """The ladder for the terminal: the table, the rules and assumptions it rests on, and each rung's command."""
    a = p["assumptions"]
    head = (f"Ladder to {p['target']} at {_si(p['tokens'])} tokens = {p['tokens_per_parameter']:.1f} tokens per "
            f"parameter ({'trunk with embeddings' if p['count'] == 'total' else 'trunk without embeddings'}; PLE not "
            f"counted), held on every rung. Width halves; heads, F/H and dP/H held; depth {p['depth']} "
            f"({'H/L held' if p['depth'] == 'scaled' else 'L held'}); vocabulary {p['vocab']} "
            f"({'V/H held' if p['vocab'] == 'scaled' else 'the target tokenizer'}).")
    cols = ("H", "L", "V", "dP", "dP/H", "N total", "N non-emb", "tokens", "tok/row", "FLOPs", "GPU-h", "CPU-h",
            "mem dense", "+ckpt", "row-sparse", "host table", "runs on")
    rows = [(str(r["hidden_size"]), str(r["num_hidden_layers"]), f"{r['vocab_size']:,}", str(r["dP"]),
             f"{r['dP_over_H']:.3g}", f"{r['params_total']:,}", f"{r['params_non_embedding']:,}", _si(r["tokens"]),
             _si(r["tokens_per_table_row"]), f"{r['train_flops']:.3g}", f"{r['gpu_hours']:,.1f}",
             f"{r['cpu_hours']:,.1f}", *(f"{r['device_memory_bytes'][k] / 2**30:,.1f} GiB"
                                         for k in ("dense", "dense_ckpt", "row-sparse_ckpt", "host_ckpt")),
             r["runs_on"]) for r in p["rungs"]]
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]
    table = [" ".join(c.rjust(w) for c, w in zip(cols, widths))] + [" ".join(v.rjust(w) for v, w in zip(row, widths))
                                                                   for row in rows]
    assume = (f"Assumptions: {a['gpu'].upper()} dense bf16 peak {p['gpu_peak_flops'] / 1e12:.0f} TFLOP/s at MFU "
              f"{a['mfu']:g}; CPU {a['cpu_flops'] / 1e9:.0f} GFLOP/s sustained (CPU-affordable: ≤ "
              f"{a['cpu_budget_hours']:g} h); {a['world']} GPUs data-parallel, "
              f"{'FSDP-sharded trunk' if a['fsdp'] else 'DDP replicas'}, micro-batch {a['micro_batch']} × "
              f"{a['seq_len']} tokens. Memory per device: fp32 weights + grads + AdamW moments, bf16 activations with "
              "fused attention (34·T·b·H bytes per layer), '+ckpt' and the table columns with per-layer activation "
              "checkpointing (the row-sparse and host-side tables run under DDP: trunk replicated).")
    cmds = [f"  H={r['hidden_size']}: {r['command']}" for r in p["rungs"]]
    return "\n".join([head, "", *table, "", assume, *(f"Note: {n}" for n in p["notes"]), "", "Commands:", *cmds])


__all__ = ["Assumptions", "GPU_BF16_PEAK", "SEED_DP_RATIOS", "device_memory", "ladder", "ladder_text"]
