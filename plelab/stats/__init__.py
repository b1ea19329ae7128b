"""The statistics of a study, a layer of their own above the run engine (:mod:`plelab.sweeps`): paired and blocked
comparisons that cannot over-claim, power and seeds to decide, the dP study's analysis, advice and planning, the
token-budget reading and the gate mechanism.

``from plelab import stats`` gives the comparison toolkit (:mod:`plelab.stats.comparisons`: t intervals, TOST, Holm,
labels, MDE); the rest are modules: :mod:`~plelab.stats.power`, :mod:`~plelab.stats.blocked`,
:mod:`~plelab.stats.analysis`, :mod:`~plelab.stats.advise`, :mod:`~plelab.stats.planning`,
:mod:`~plelab.stats.budget`, :mod:`~plelab.stats.mechanism`.
"""

from plelab.stats.comparisons import (DIMINISHING, DROP, EQUIVALENT, INCONCLUSIVE, RISE, SMALL_DROP, SMALL_RISE,
                                      Comparison, family, family_seeds, from_estimate, holm, label, labels_at, mde,
                                      mean_sd, noninferiority_p, paired, seeds_to_label, sensitivity, spearman,
                                      t_quantile, tost_p, within_group_spearman)

__all__ = ["DIMINISHING", "DROP", "EQUIVALENT", "INCONCLUSIVE", "RISE", "SMALL_DROP", "SMALL_RISE", "Comparison",
           "family", "family_seeds", "from_estimate", "holm", "label", "labels_at", "mde", "mean_sd", "noninferiority_p",
           "paired", "seeds_to_label", "sensitivity", "spearman", "t_quantile", "tost_p", "within_group_spearman"]
