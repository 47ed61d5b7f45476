"""Evidence: the append-only event log in Postgres, its migrations, and the projections read from it."""
