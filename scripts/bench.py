"""Entry point of tools/bench.py, the benchmark against ceilings measured in the same run
(docs/BENCHMARKS.md); `--help` says how to run it."""

from tools.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
