"""Where MySQL/MariaDB, PostgreSQL and SQLite differ, in one place: every other SQL module writes
one statement for all three and asks here for the few parts that cannot be shared."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

# Worth one more try of the whole transaction. MySQL/MariaDB: deadlock (1213), lock wait timeout
# (1205). PostgreSQL: deadlock detected (40P01), serialization failure (40001).
_RETRYABLE_MYSQL = frozenset({1205, 1213})
_RETRYABLE_POSTGRESQL = frozenset({"40P01", "40001"})


class OctetLength(FunctionElement[int]):
    """The length of a text expression in bytes of UTF-8, computed by the database."""

    type = sa.Integer()
    inherit_cache = True


@compiles(OctetLength)
def _octet_length(element: OctetLength, compiler: SQLCompiler, **kw: object) -> str:
    # SQLite's LENGTH counts a text's characters and a BLOB's bytes.
    return f"LENGTH(CAST({compiler.process(element.clauses, **kw)} AS BLOB))"


@compiles(OctetLength, "mysql")
def _octet_length_mysql(element: OctetLength, compiler: SQLCompiler, **kw: object) -> str:
    return f"LENGTH({compiler.process(element.clauses, **kw)})"


@compiles(OctetLength, "postgresql")
def _octet_length_postgresql(element: OctetLength, compiler: SQLCompiler, **kw: object) -> str:
    return f"OCTET_LENGTH({compiler.process(element.clauses, **kw)})"


def insert_if_absent(dialect: str, table: sa.Table, values: dict[str, Any]) -> sa.Executable:
    """INSERT that does nothing when a row with the same key exists (MySQL has no DO NOTHING: it
    updates the key to itself)."""
    if dialect == "mysql":
        key = next(iter(table.primary_key.columns)).name
        return mysql_insert(table).values(**values).on_duplicate_key_update({key: table.c[key]})
    if dialect == "postgresql":
        return postgresql_insert(table).values(**values).on_conflict_do_nothing()
    return sqlite_insert(table).values(**values).on_conflict_do_nothing()


def retryable(exc: sa.exc.DBAPIError) -> bool:
    """A failure of the whole transaction that another try of it can get past: a deadlock, a lock
    wait timeout, a serialization failure."""
    orig = exc.orig
    sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if sqlstate is not None:
        return sqlstate in _RETRYABLE_POSTGRESQL
    code = getattr(orig, "args", (None,))[0]
    return code in _RETRYABLE_MYSQL


def refused(exc: sa.exc.DBAPIError) -> bool:
    """The server answered and refused the statement (a constraint, a value out of range): it is
    up, and the statement would fail again. asyncpg's driver reports PostgreSQL's data and
    integrity errors (SQLSTATE classes 22 and 23) as its generic Error; SQLAlchemy's other drivers
    raise DataError and IntegrityError."""
    if isinstance(exc, sa.exc.IntegrityError | sa.exc.DataError):
        return True
    sqlstate = getattr(exc.orig, "sqlstate", None)
    return isinstance(sqlstate, str) and sqlstate[:2] in {"22", "23"}


def in_index_order(q: sa.Select[Any], table: sa.Table, index: str) -> sa.Select[Any]:
    """`q` read through `index` on MySQL/MariaDB. Their optimizer takes `WHERE session_id = ?
    ORDER BY id LIMIT n` for a walk of the primary key in id order that skips other sessions'
    rows: a session written before most others was read past all of them (20-30 ms for 64 rows
    in a table of 36,000; linear in the table, not the session). PostgreSQL and SQLite choose the
    (session_id, id) index themselves."""
    hint = f"FORCE INDEX ({index})"
    return q.with_hint(table, hint, dialect_name="mysql").with_hint(table, hint, dialect_name="mariadb")
