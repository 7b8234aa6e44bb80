"""The hot tier on Redis: the client link and its protocol (`link`, `resp`, `url`), every key
in one place (`keys`), the hot tier itself (`hot`, with `hot_cache`: RESP3 client-side caching
of a session's entries), its Lua scripts and their arguments (`scripts`, `argv`), and Redis's
recall postings, their budget, jobs and rate buckets (`postings`, `recall_usage`, `jobs`, `buckets`).

It may import the shared tier modules (`tiers/`) and the package's shared modules; never the
SQL tier.
"""
