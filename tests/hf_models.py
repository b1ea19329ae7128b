"""Tiny random HF causal LMs for the attach and monitor tests, built locally from configs (nothing downloaded)."""

from __future__ import annotations

import torch
import transformers

VOCAB, HIDDEN, LAYERS = 96, 32, 2


def tiny_host(kind: str = "llama", **extra):
    """A tiny random HF causal LM of family ``kind`` (seeded)."""
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
                  num_attention_heads=4, **extra)
    heads = dict(num_key_value_heads=2)
    configs = {
        "llama": lambda: transformers.LlamaConfig(**heads, **common),
        "mistral": lambda: transformers.MistralConfig(**heads, **common),
        "qwen2": lambda: transformers.Qwen2Config(**heads, **common),
        "qwen3": lambda: transformers.Qwen3Config(**heads, head_dim=8, **common),
        "gemma2": lambda: transformers.Gemma2Config(**heads, head_dim=8, **common),
        "gemma3_text": lambda: transformers.Gemma3TextConfig(**heads, head_dim=8, **common),
        "gpt_neox": lambda: transformers.GPTNeoXConfig(**common),
    }
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(configs[kind]())


def batch(seed: int = 0, b: int = 2, t: int = 12) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def windows(seed: int, n: int, t: int = 13) -> torch.Tensor:
    """``n`` random token windows ``[n, t]`` of the tiny vocabulary (seeded)."""
    return torch.randint(0, VOCAB, (n, t), generator=torch.Generator().manual_seed(seed))


def monitored_loop(model, monitor, data: torch.Tensor, batch: int = 4, lr: float = 1e-2) -> list[dict]:
    """A plain PyTorch loop: ``data`` in batches of ``batch`` with plelab's AdamW groups, ``monitor.step`` after each
    backward (before the gradients are zeroed); returns the rows the monitor wrote, one per step."""
    import plelab

    opt = plelab.adamw(plelab.param_groups(model, lr=lr))
    rows = []
    for step in range(len(data) // batch):
        ids = data[batch * step:batch * step + batch]
        model(ids, labels=ids).loss.backward()
        rows.append(monitor.step(step))
        opt.step()
        opt.zero_grad()
    return rows


def hf_trainer_monitored(model, out) -> list[dict]:
    """4 steps of HF ``Trainer`` (batches of 4 of 16 random windows, plelab's AdamW groups) with the Monitor's callback
    (``every=2``, ``checkpoint_every=4``, 4 validation windows) writing to ``out``; returns the rows it wrote."""
    import json

    from transformers import Trainer, TrainingArguments

    import plelab

    data = [{"input_ids": w, "labels": w} for w in windows(3, 16)]
    monitor = plelab.Monitor(model, out, every=2, checkpoint_every=4, val_windows=windows(7, 4))
    args = TrainingArguments(output_dir=str(out.parent / "hf"), per_device_train_batch_size=4, max_steps=4,
                             learning_rate=1e-2, report_to=[], save_strategy="no", use_cpu=True, logging_steps=1,
                             disable_tqdm=True)
    opt = plelab.adamw(plelab.param_groups(model, lr=1e-2))
    Trainer(model=model, args=args, train_dataset=data, optimizers=(opt, None),
            callbacks=[plelab.integrations.HFTrainerCallback(monitor)]).train()
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def lightning_module(lightning, model):
    """A LightningModule training ``model`` (an attached HF causal LM) on batches of token ids with plelab's AdamW."""
    import plelab

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lm = model

        def training_step(self, ids, _):
            return self.lm(ids, labels=ids).loss

        def configure_optimizers(self):
            return plelab.adamw(plelab.param_groups(self.lm, lr=1e-2))

    return Module()
