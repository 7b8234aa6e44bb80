"""Entry point of tools/trace_cost.py, what tracing costs a turn (docs/BENCHMARKS.md); `--help` says
how to run it."""

from tools.trace_cost import main

if __name__ == "__main__":
    raise SystemExit(main())
