"""Operator commands: what `tiered-memory` runs besides `serve` (`admin`: migrate, sweep,
summarize, export and the rest; `events` and `users`: the outbox and user memory's commands;
`importer`: bulk import of transcripts).

They stand above the daemon: they may import `app.py` and the HTTP edge's input checks, and
nothing of the daemon imports them.
"""
