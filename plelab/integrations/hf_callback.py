"""A :class:`plelab.Monitor` driven by HF ``Trainer`` (imports transformers: load it through ``plelab.integrations``)."""

from __future__ import annotations

import os
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from transformers import TrainerCallback

from plelab.diagnostics.monitor import Monitor
from plelab.errors import PlelabError
from plelab.io import atomic_write

#: the Monitor's state inside each HF checkpoint folder (``checkpoint-N/``), one file per rank under torchrun
STATE_FILE = "plelab_monitor{rank}.safetensors"
LOGGED = ("loss", "learning_rate", "grad_norm")


def _state_path(folder: str | Path, monitor: Monitor) -> Path:
    rank = f"-rank{monitor.dist.rank}" if monitor.dist.world_size > 1 else ""
    return Path(folder) / STATE_FILE.format(rank=rank)


class HFTrainerCallback(TrainerCallback):
    """``transformers.Trainer(..., callbacks=[HFTrainerCallback(monitor)])``.

    - :meth:`Monitor.step` once per optimizer step, after the backward and HF's gradient clipping, before the
      optimizer steps (``on_pre_optimizer_step``); steps are completed steps, 1-based, as plelab's trainer counts;
    - the final verdict at the last step whatever ``checkpoint_every`` is (:meth:`Monitor.finish`, ``on_train_end``);
    - the Monitor's row counts saved into each HF checkpoint folder (``on_save``) and restored by
      ``trainer.train(resume_from_checkpoint=…)`` — a resume from a checkpoint without them is refused, so the counts
      never restart;
    - the host's loss, learning rate and gradient norm appended to the Monitor's ``metrics.jsonl``, and the
      Monitor's scalars (``plelab/…``) added to the logs ``report_to`` loggers receive — which needs this callback
      to run before them: :meth:`install` puts it first (callbacks passed to ``Trainer`` run after the loggers);
    - a warning when the optimizer decays the table (:meth:`Monitor.check_optimizer`).
    """

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self._fresh = False  # a diagnostics row written since the last log: its scalars go to the next one

    def install(self, trainer) -> HFTrainerCallback:
        """Put this callback first in ``trainer``'s callbacks, so its scalars reach the ``report_to`` loggers."""
        trainer.callback_handler.callbacks.insert(0, self)
        return self

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        if optimizer is not None:
            self.monitor.check_optimizer(optimizer)
        if self.monitor.total_steps is None and state.max_steps:
            self.monitor.total_steps = int(state.max_steps)
        if state.global_step > 0:  # resumed: HF has loaded checkpoint-{global_step}
            path = _state_path(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"), self.monitor)
            try:
                with safe_open(str(path), framework="pt") as f:
                    meta = f.metadata() or {}
                    counts = f.get_tensor("row_counts")
            except (OSError, SafetensorError):
                raise PlelabError(f"resuming at step {state.global_step}, but {path} is missing or unreadable: that "
                                  "checkpoint was saved without the plelab Monitor's state, so its row counts would "
                                  "restart from 0; resume from a checkpoint saved with HFTrainerCallback, or give the "
                                  "Monitor a new folder and no resume") from None
            last = meta.get("last_checkpoint")
            self.monitor.load_state_dict({"step": int(meta.get("step", state.global_step)), "row_counts": counts,
                                          "last_checkpoint": int(last) if last not in (None, "") else None})

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._fresh |= bool(self.monitor.step(state.global_step))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None:
            return
        self.monitor.log(state.global_step, {k: logs[k] for k in LOGGED if k in logs})
        if self._fresh:
            logs.update(self.monitor.scalars())
            self._fresh = False

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        s = self.monitor.state_dict()
        meta = {"step": str(s["step"]), "last_checkpoint": "" if s["last_checkpoint"] is None
                else str(s["last_checkpoint"])}
        path = _state_path(folder, self.monitor)
        atomic_write(path, lambda p: save_file({"row_counts": s["row_counts"].contiguous()}, str(p), metadata=meta))

    def on_train_end(self, args, state, control, **kwargs):
        self.monitor.finish(state.global_step)
