"""tiered-memory: conversation memory for LLM voice and chat gateways."""

__version__ = "0.1.0"
