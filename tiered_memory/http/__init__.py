"""The HTTP edge: the aiohttp routes (`api`, `users`, `inspect`), what a request may say (`input`),
who may say it (`auth`, `local_guard`, `addresses`), whether it is let in now (`admission`,
`rate_limit`), the shared handler plumbing (`edge`, `keys`), the OpenAPI document, and the server
itself (`serving`: sockets, deadlines, worker processes with `workers`).

It may import everything below it (`core`, `summarize`, `tiers`, `prompt`, `text` and the shared
modules of the package's top level), and nothing imports it but `app.py` (the composition root),
`cli.py`, `startup.py` (which parses the tokens) and `ops/`.
"""
