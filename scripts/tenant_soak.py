"""Entry point of tools/tenant_soak.py, one tenant's load against another's latency (docs/SECURITY.md);
`--help` says how to run it."""

from tools.tenant_soak import main

if __name__ == "__main__":
    raise SystemExit(main())
