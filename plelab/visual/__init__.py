"""Visual PLE: image–caption data, visual IDs (tokenizers), their metrics, and the multimodal model.

Importing the package registers the ``visual`` kind of run (:mod:`plelab.visual.task`) with the trainer's task
registry, the visual study's report with :func:`plelab.reports.register_report` and its cross-seed structure
with :func:`plelab.sweeps.results.register_structure_reader`.
"""

from plelab.reports.study import register_report
from plelab.sweeps.results import register_structure_reader
from plelab.visual import task as _task  # noqa: F401  (registers the visual kind of run)
from plelab.visual.report import write_visual_report
from plelab.visual.study import study_structure

register_report("visual", write_visual_report)
register_structure_reader("visual", study_structure)
