"""Named presets. Each is a function returning a fresh :class:`RunConfig`.

- ``seed-3b``: the seeds' 3B model (H=2560, L=32, 20Q/4KV, head_dim 128, FFN 6912,
  V=100,096, tied, no biases, 2 RMSNorms per layer + final). Reproduces the seed's
  2,458,421,760 base parameters (``docs/ple.md`` §2.3).
- ``gemma3n-e2b`` / ``gemma3n-e4b``: Gemma 3n's PLE dimensions (Vp=262,144, dP=256,
  H=2048, L=30 / 35) on plelab's plain trunk. The PLE counts are Gemma 3n's exactly; the
  trunk has no AltUp / LAuReL / KV sharing, so its count is not Gemma 3n's total.
- ``cpu-tiny``: tests (seconds). ``cpu-small``: ~6.8M trunk params, single CPU runs.
- ``cpu-sweep``: ~1.3M params, the dP study's CPU shape (``plelab demo`` / ``plelab sweep``).
- ``cpu-sweep-h160``: the same at H = 160, where the seed's dP/H ratios are dP 4/8/16/32 (``plelab demo --study``).
- ``cpu-long-h160``: a 0.46 M-parameter trunk at H = 160 trained to 20 tokens per trunk parameter
  (``plelab demo --long``, on ``data.embedded=packages``).
- ``gpu-125m``: a GPT-2-small-sized model for one GPU.
"""

from __future__ import annotations

from collections.abc import Callable

from plelab.config.schema import DataConfig, ModelConfig, PLEConfig, RunConfig, TrainConfig
from plelab.errors import ConfigError


def seed_3b() -> RunConfig:
    return RunConfig(
        preset="seed-3b",
        model=ModelConfig(vocab_size=100_096, hidden_size=2560, num_hidden_layers=32, num_attention_heads=20,
                          num_key_value_heads=4, head_dim=128, intermediate_size=6912),
        ple=PLEConfig(dim=256),
        train=TrainConfig(seq_len=4096, batch_size=1, device="cuda"),
    )


def _gemma3n(name: str, layers: int, ffn: int) -> RunConfig:
    return RunConfig(
        preset=name,
        model=ModelConfig(vocab_size=262_400, hidden_size=2048, num_hidden_layers=layers, num_attention_heads=8,
                          num_key_value_heads=2, head_dim=256, intermediate_size=ffn),
        ple=PLEConfig(dim=256, vocab_size=262_144),
        train=TrainConfig(seq_len=4096, batch_size=1, device="cuda"),
    )


def gemma3n_e2b() -> RunConfig:
    return _gemma3n("gemma3n-e2b", layers=30, ffn=2048 * 4)


def gemma3n_e4b() -> RunConfig:
    return _gemma3n("gemma3n-e4b", layers=35, ffn=2048 * 8)


def cpu_tiny() -> RunConfig:
    return RunConfig(
        preset="cpu-tiny",
        model=ModelConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=176),
        ple=PLEConfig(dim=16),
        train=TrainConfig(steps=60, batch_size=8, seq_len=64, lr=3e-3, warmup_steps=10, eval_every=20,
                          eval_batches=4),
    )


def cpu_small() -> RunConfig:
    return RunConfig(
        preset="cpu-small",
        model=ModelConfig(vocab_size=8192, hidden_size=256, num_hidden_layers=6, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=768),
        ple=PLEConfig(dim=64),
        train=TrainConfig(steps=600, batch_size=16, seq_len=128, lr=2e-3, warmup_steps=50, eval_every=100,
                          eval_batches=16),
    )


def cpu_sweep() -> RunConfig:
    """The dP study's CPU shape: ~1.3M trunk params, ~0.3 s/step on one core (two runs in parallel)."""
    return RunConfig(
        preset="cpu-sweep",
        model=ModelConfig(vocab_size=4096, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=384),
        ple=PLEConfig(dim=32),
        train=TrainConfig(steps=300, batch_size=16, seq_len=128, lr=3e-3, warmup_steps=30, eval_every=25,
                          eval_batches=8, log_every=50, checkpoint_every=100, keep_checkpoints=1,
                          early_checkpoint=75, diag_every=25),
    )


def cpu_sweep_h160() -> RunConfig:
    """``cpu-sweep`` at H = 160 (FFN 3H, head_dim 40), so that the seed's dP/H ratios 0.025 / 0.05 / 0.1 / 0.2
    (dP 64 … 512 at H = 2560) are whole dP: 4 / 8 / 16 / 32 (``plelab demo --study``)."""
    cfg = cpu_sweep()
    cfg.preset = "cpu-sweep-h160"
    cfg.model.hidden_size, cfg.model.intermediate_size, cfg.ple.dim = 160, 480, 8
    return cfg


def cpu_long_h160() -> RunConfig:
    """Past the toy regime on a CPU: H = 160 (the seed's dP/H ratios are dP 4 / 8 / 16 / 32), L = 2, FFN 2H, V = 2048:
    461,600 trunk parameters without embeddings (789,280 with), trained 2,300 steps × 32 × 128 = 9.42 M tokens —
    20.4 tokens per trunk parameter, 11.9 with the embeddings (``plelab demo --long``)."""
    return RunConfig(
        preset="cpu-long-h160",
        model=ModelConfig(vocab_size=2048, hidden_size=160, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=320),
        ple=PLEConfig(dim=8),
        train=TrainConfig(steps=2300, batch_size=32, seq_len=128, lr=3e-3, warmup_steps=200, eval_every=100,
                          eval_batches=16, log_every=100, checkpoint_every=250, keep_checkpoints=1,
                          early_checkpoint=575, diag_every=100),
    )


def gpu_125m() -> RunConfig:
    return RunConfig(
        preset="gpu-125m",
        model=ModelConfig(vocab_size=32_768, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                          num_key_value_heads=4, intermediate_size=3072),
        ple=PLEConfig(dim=64),
        train=TrainConfig(steps=5000, batch_size=32, seq_len=1024, lr=1e-3, warmup_steps=200, eval_every=250,
                          eval_batches=32, device="cuda"),
        data=DataConfig(),
    )


PRESETS: dict[str, Callable[[], RunConfig]] = {
    "cpu-tiny": cpu_tiny,
    "cpu-small": cpu_small,
    "cpu-sweep": cpu_sweep,
    "cpu-sweep-h160": cpu_sweep_h160,
    "cpu-long-h160": cpu_long_h160,
    "gpu-125m": gpu_125m,
    "seed-3b": seed_3b,
    "gemma3n-e2b": gemma3n_e2b,
    "gemma3n-e4b": gemma3n_e4b,
}


def get_preset(name: str) -> RunConfig:
    """A fresh copy of the named preset, or a one-line ConfigError listing the names."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}")
    return PRESETS[name]()
