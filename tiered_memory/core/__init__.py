"""The daemon's core: what `service.py` does for each API call over the tiers. The tier walk
(`reads`: hot, warm, cold, and the older turns from `history`), recall over a session
(`recall`), erasure of a user (`erasure`), retention (`retention`), the inspector's read
(`inspection`), and the delivery of lifecycle events to their receivers (`delivery`).

It may import `summarize`, `tiers`, `prompt`, `text` and the package's shared modules; only the
HTTP edge, `app.py` and `ops/` import it.
"""
