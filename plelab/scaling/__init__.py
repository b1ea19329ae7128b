"""Scaling laws from plelab's runs, a layer above the run engine (:mod:`plelab.sweeps`): the fits
(:mod:`~plelab.scaling.laws`), fits of finished runs (:mod:`~plelab.scaling.scaling_runs`), the ladder of runs a
target needs (:mod:`~plelab.scaling.ladder`) and the toy ladder that checks the fit (:mod:`~plelab.scaling.fit_ladder`).
"""
