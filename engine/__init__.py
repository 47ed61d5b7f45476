"""Kernel Factory's domain: evidence, problems, backends, evaluation, proposers, services and CLI.

Nothing in this package imports Temporal, so all of it can be used and tested without a server.
"""
