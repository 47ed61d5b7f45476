"""Temporal workflow definitions: deterministic, no I/O, no clock, no randomness outside Temporal's APIs."""
