"""The three storage tiers: hot (Redis in `redis/`, or in-process in `memory_hot.py`), warm and
cold (SQL, in `sql/`).

This folder's own modules are what both sides share: the hot tier's contract (`hot`), the recall
postings (`postings`), jobs and rate buckets (`jobs`, `buckets`), the message codec (`codec`) and
the errors a tier raises (`errors`). The tiers import nothing above them (`core`, `summarize`, the
HTTP edge) and `prompt` only for the user profile's merge.
"""
