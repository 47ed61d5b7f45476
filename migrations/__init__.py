"""The event store's SQL migrations, ``NNNN_what_it_does.sql``: package data, applied by engine/evidence/migrations.py.

A package only so that a wheel ships them and ``importlib.resources`` finds them in any install."""
