"""Test helpers for dlu-brain: the database conformance suite and a real PostgreSQL server."""
