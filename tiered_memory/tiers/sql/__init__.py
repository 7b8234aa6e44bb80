"""The warm and cold tiers in SQL (SQLite, MySQL/MariaDB, PostgreSQL): the schema and its
migrations (`schema`, `migrate`), the engine and its URL (`engine`, `url`, `dialect`), the
store (`store`) and the statements it runs, one concern a module (`append`, `group_commit`,
`patch`, `messages`, `summaries` and their `versions`, `users`, `outbox`, `quota`, `replica`,
`maintenance`, `rows`).

It may import the shared tier modules (`tiers/`), `prompt` (a user profile is merged in the
transaction that writes a summary), `webhooks.py` (events are written in the transactions that
cause them) and the package's shared modules; never the Redis tier.
"""
