"""Thin Temporal activities: each turns one workflow step into calls on ``engine`` and records the outcome."""
