"""Revision scripts, one per schema version; Alembic loads them by path (this file it skips)."""
