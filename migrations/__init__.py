"""Alembic revisions of chatbridge's schema (see bridge/store/migrate.py)."""

HEAD = "0014"
"""The newest revision: a start-up compares the database with it without importing
Alembic. A new revision updates it; tests/store/test_migrations.py checks it."""
