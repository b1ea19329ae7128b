"""Visual PLE: image–caption data, visual IDs (tokenizers), their metrics, and the multimodal model.

Importing the package registers the ``visual`` kind of run (:mod:`plelab.visual.task`) with the trainer's task
registry and the visual study's report with :func:`plelab.reports.register_report`.
"""

from plelab.reports import register_report
from plelab.reports.visual import write_visual_report
from plelab.visual import task as _task  # noqa: F401  (registers the visual kind of run)

register_report("visual", write_visual_report)
