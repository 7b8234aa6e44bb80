"""The pieces of tools/bench.py: load generator, child servers, seeding, report."""
