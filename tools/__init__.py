"""The project's own measuring instruments, none of them part of the daemon: the benchmark
(bench.py with benchkit/), the soaks (soak.py with soak_report.py, tenant_soak.py), the capacity
calculator and its measurement (capacity.py, capacity_measure.py), what a context read, a log line
and tracing cost (context_cost.py, log_cost.py, trace_cost.py) and the walkthrough of one session
(walkthrough.py). Each module's main() is run by a thin entry point of the same name in scripts/;
the package imports nothing from tests and edits no sys.path (the editable install puts it there).
"""
