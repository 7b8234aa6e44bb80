"""Entry point of tools/log_cost.py, what the per-request log line costs (docs/BENCHMARKS.md); `--help`
says how to run it."""

from tools.log_cost import main

if __name__ == "__main__":
    raise SystemExit(main())
