"""Optimizer groups, LR schedule and the training loop."""
