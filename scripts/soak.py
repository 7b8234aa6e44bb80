"""Entry point of tools/soak.py, the soak: concurrent sessions under injected faults, checked in SQL
(docs/RELIABILITY.md); `--help` says how to run it."""

from tools.soak import main

if __name__ == "__main__":
    raise SystemExit(main())
