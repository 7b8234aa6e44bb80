"""The pure context assembly: a context in one call from what the tier walk gathered
(`assemble`), which memory it shows within its budget (`policy`, `selections`), how the chosen
pieces are put in the messages a model reads (`context`), what the policy works out once per
message (`memo`), knowledge-base snippets (`kb_snippets`), the summary's facts as a context
renders them (`facts`), and a user's memory across sessions (`users`).

No I/O: every function takes values and returns values. It imports `text` and the shared
modules (`model`, `lru`, `payload.py`: the structured summary's shape) only; the tier walk
(`core/reads.py`) calls it through `assemble` alone, and the SQL tier for the user profile's merge.
"""
