"""Greedy held-out evaluation: EM, F1 and search behaviour, standalone or every N steps."""
