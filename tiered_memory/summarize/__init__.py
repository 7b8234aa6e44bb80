"""A summary's whole life: the LLM summarizer (`llm`, with `grounding` and `numerals` checking its
output), the deterministic extractor it falls back to (`extractive`, `topics`, `cold` for a
session with no summary yet), when one is due (`cadence`), the job that makes and stores it
(`job`), run in the background (`background`) on a bounded pool (`scheduler`), rebuilds on
request (`rebuilds`), and the text workers the CPU-bound work runs in (`lane`). The payload both
summarizers produce is `payload.py`, a floor down, since a context reads it too.

It may import `tiers`, `prompt`, `text` and the package's shared modules; `core`, the HTTP edge
and `ops/` call it.
"""
