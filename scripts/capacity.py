"""Entry point of tools/capacity.py, the capacity calculator: a fleet's shape in, servers and memory
out (docs/CAPACITY.md); `--help` says how to run it."""

from tools.capacity import main

if __name__ == "__main__":
    raise SystemExit(main())
