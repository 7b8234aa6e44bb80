"""The daemon's core: what `service.py` does for each API call over the tiers. The tier walk
(`reads`: hot, warm, cold, and the older turns from `history`), recall over a session
(`recall`), a user's memory across sessions and its erasure (`user_memory`, `erasure`), retention
(`retention`), the inspector's read (`inspection`), each tier's readiness (`readiness`), and the
delivery of lifecycle events to their receivers (`delivery`).

It may import `summarize`, `tiers`, `prompt`, `text` and the package's shared modules; only the
HTTP edge, `app.py` and `ops/` import it.
"""
