"""The pieces of scripts/bench.py: load generator, child servers, seeding, report."""
