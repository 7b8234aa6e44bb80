"""The project's own measuring instruments, none of them part of the daemon nor of its wheel: the
benchmark (bench.py with benchkit/), the soaks (soak.py with soak_report.py, tenant_soak.py), the
capacity calculator and its measurement (capacity.py, capacity_measure.py), what a context read, a
log line and tracing cost (context_cost.py, log_cost.py, trace_cost.py), the walkthrough of one
session (walkthrough.py) and the writer of the shipped quality set (bilingual.py).

Each runs from a checkout as `python -m bench.<name>` (`-m` puts the current directory, the
checkout, on sys.path: no install of this folder is needed, and none is made). The package imports
nothing from tests and edits no sys.path.
"""
