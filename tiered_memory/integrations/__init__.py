"""Adapters of frameworks to the daemon, each a thin layer over tiered_memory.client; each module
needs its own extra and is imported only by the caller."""
