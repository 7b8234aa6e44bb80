"""The Alembic migration scripts of the SQL schema, shipped inside the package.

`tiered_memory.tiers.sql.migrate` runs them from `tiered-memory migrate` (and AUTO_MIGRATE) on the
daemon's own connection: no alembic.ini is needed at runtime. Revision ids are the schema version
numbers, continuing the numbering of the schema_version table that came before Alembic (1-3).
"""
