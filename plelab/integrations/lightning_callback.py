"""A :class:`plelab.Monitor` driven by Lightning (imports lightning: load it through ``plelab.integrations``)."""

from __future__ import annotations

from lightning.pytorch import Callback

from plelab.diagnostics.monitor import Monitor


class LightningCallback(Callback):
    """``lightning.Trainer(callbacks=[LightningCallback(monitor)])``.

    Calls :meth:`Monitor.step` once per optimizer step, after the backward and before the optimizer steps
    (``on_before_optimizer_step``; completed steps, 1-based), warns when the optimizer decays the table
    (``on_train_start``), writes the final verdict at the last step (:meth:`Monitor.finish`, ``on_train_end``), and
    keeps the Monitor's row counts in Lightning's checkpoints (``state_dict`` / ``load_state_dict``), so that
    ``trainer.fit(..., ckpt_path=…)`` continues them instead of restarting from 0.
    """

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def on_train_start(self, trainer, pl_module):
        for optimizer in trainer.optimizers:
            self.monitor.check_optimizer(optimizer)
        if self.monitor.total_steps is None and trainer.max_steps and trainer.max_steps > 0:
            self.monitor.total_steps = int(trainer.max_steps)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.monitor.step(trainer.global_step)

    def on_train_end(self, trainer, pl_module):
        self.monitor.finish(trainer.global_step)

    def state_dict(self) -> dict:
        return self.monitor.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.monitor.load_state_dict(state_dict)
