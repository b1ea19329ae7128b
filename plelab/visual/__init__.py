"""Visual PLE: image–caption data, visual IDs (tokenizers), their metrics, and the multimodal model.

Importing the package registers the ``visual`` kind of run (:mod:`plelab.visual.task`) with the trainer's task
registry.
"""

from plelab.visual import task as _task  # noqa: F401  (registers the visual kind of run)
