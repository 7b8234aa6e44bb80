"""Entry point of tools/context_cost.py, what a context read costs by session length, in one process
(docs/BENCHMARKS.md); `--help` says how to run it."""

from tools.context_cost import main

if __name__ == "__main__":
    raise SystemExit(main())
