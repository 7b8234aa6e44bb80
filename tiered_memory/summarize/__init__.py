"""Summarizers: the LLM one and the deterministic extractive fallback."""
