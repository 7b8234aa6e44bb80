"""The pieces of bench/bench.py: load generator, child servers, seeding, report."""
