"""`python -m tiered_memory` runs the same CLI as the `tiered-memory` console script."""

from tiered_memory.cli import main

raise SystemExit(main())
