#!/usr/bin/env python3
"""Entry point of tools/walkthrough.py, one session through a daemon process, step by step (README.md);
`--help` says how to run it."""

from tools.walkthrough import main

if __name__ == "__main__":
    raise SystemExit(main())
