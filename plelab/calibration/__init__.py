"""Calibrating the early verdict: a labelled benchmark of runs, the statistics each call reads, thresholds
fitted on some configurations and error rates measured on others (``plelab calibrate``)."""
