"""The parts of ``bench/proxy.py`` (what compact-proxy costs a request), one module each:
latency (parts 1-3), throughput (4), streams (6), session (7), the whole run, ``--audit``,
the goals of issues #4 and #13, and the report (with part 5, CPU per request)."""
