"""The pure context assembly: which memory a context shows within its budget (`policy`,
`selections`), how the chosen pieces are put in the messages a model reads (`context`), the
gateway's notes and knowledge-base snippets (`notes`, `kb_snippets`), the summary's facts as a
context renders them (`facts`), and a user's memory across sessions (`users`).

No I/O: every function takes values and returns values. It imports `text`, `model` and `lru`
only; the tier walk (`core/reads.py`) and the SQL tier (the user profile's merge) call it.
"""
