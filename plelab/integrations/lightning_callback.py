"""A :class:`plelab.Monitor` driven by Lightning (imports lightning: load it through ``plelab.integrations``)."""

from __future__ import annotations

from lightning.pytorch import Callback

from plelab.diagnostics.monitor import Monitor


class LightningCallback(Callback):
    """``lightning.Trainer(callbacks=[LightningCallback(monitor)])``.

    Calls :meth:`Monitor.step` once per optimizer step, after the backward and before the optimizer steps
    (``on_before_optimizer_step``), and :meth:`Monitor.close` when training ends.
    """

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.monitor.step(trainer.global_step)

    def on_train_end(self, trainer, pl_module):
        self.monitor.close()
