"""Entry point of tools/capacity_measure.py, the capacity calculator's constants, measured on real
servers (docs/CAPACITY.md); `--help` says how to run it."""

from tools.capacity_measure import main

if __name__ == "__main__":
    raise SystemExit(main())
