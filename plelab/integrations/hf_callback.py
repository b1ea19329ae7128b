"""A :class:`plelab.Monitor` driven by HF ``Trainer`` (imports transformers: reach it as
``plelab.integrations.HFTrainerCallback``)."""

from __future__ import annotations

from transformers import TrainerCallback

from plelab.diagnostics.monitor import Monitor


class HFTrainerCallback(TrainerCallback):
    """``transformers.Trainer(..., callbacks=[HFTrainerCallback(monitor)])``.

    Calls :meth:`Monitor.step` once per optimizer step — after the backward and HF's gradient clipping, before the
    optimizer steps (``on_pre_optimizer_step``) — and :meth:`Monitor.close` when training ends.
    """

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.monitor.step(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self.monitor.close()
