"""The study engine: arms × seeds, paired runs, statistics, report (the dP study; the visual study reuses it)."""

from plelab.sweeps.spec import Arm, SweepSpec, dp_arms

__all__ = ["Arm", "SweepSpec", "dp_arms"]
