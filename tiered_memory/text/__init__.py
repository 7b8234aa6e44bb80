"""Text craft shared by the prompt and the summarizers: clauses condensed (`condense`), the
language of a message and what a reply sounded like (`language`), the dialogue's roles and tool
messages in the order a model reads them (`dialogue`), and how earlier words are quoted
(`quoting`).

Pure, and the bottom room: it imports only `model`.
"""
