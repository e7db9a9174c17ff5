"""The layout of ``bench/``: small modules over one shared harness (``bench/harness/``).

Not a timed test: it reads the files. Every module stays under 500 lines, the harness's and
``bench/proxy.py``'s parts say what they hold, and every name scripts import from
``bench.proxy`` stays importable there (the harness re-exported).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
MAX_LINES = 500


def test_no_module_under_bench_reaches_500_lines() -> None:
    """Each ``.py`` file under bench/ (packages included) has fewer than 500 lines."""
    sizes = {path.relative_to(BENCH.parent).as_posix(): len(path.read_text().splitlines())
             for path in sorted(BENCH.rglob("*.py"))}
    too_long = {name: lines for name, lines in sizes.items() if lines >= MAX_LINES}
    assert not too_long, f"split these (a module stays under {MAX_LINES} lines): {too_long}"
    assert "bench/proxy.py" in sizes and "bench/harness/processes.py" in sizes


@pytest.mark.parametrize("package", ["harness", "proxy_parts"])
def test_each_module_of_the_shared_packages_says_what_it_holds(package: str) -> None:
    """A module docstring in every module of bench/harness and bench/proxy_parts."""
    modules = sorted((BENCH / package).glob("*.py"))
    assert len(modules) >= 5
    missing = [p.name for p in modules if not ast.get_docstring(ast.parse(p.read_text()))]
    assert not missing, f"no docstring: {missing}"


def test_the_scripts_names_are_still_importable_from_bench_proxy() -> None:
    """Scripts written against ``bench.proxy`` (before the harness, or by other branches)
    keep working: the names they import resolve to the harness's own objects."""
    bench_proxy = importlib.import_module("bench.proxy")
    processes = importlib.import_module("bench.harness.processes")
    workloads = importlib.import_module("bench.harness.workloads")
    imported = set()
    for path in BENCH.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "bench.proxy":
                imported |= {alias.name for alias in node.names}
    # The names the scripts imported from bench.proxy before the harness existed.
    imported |= {"_ROOT", "_headers", "_wait_until_up", "_machine_ticks", "BENCH_API_KEY",
                 "MODEL", "SESSION_THRESHOLDS", "TINY_THRESHOLDS", "AgentSession",
                 "ManagedProcess", "Service", "BenchError", "Thresholds", "baseline_worktree",
                 "children", "client_session", "free_port", "history_of_size", "percentile",
                 "process_cpu_s", "proxy_process", "read_proc_status", "relay_process",
                 "request_body", "send", "serve_null_relay", "signalled_json", "tiny_exchange",
                 "tree_cpu_s", "upstream_process", "wait_for_workers", "write_proxy_config"}
    missing = sorted(name for name in imported if not hasattr(bench_proxy, name))
    assert not missing, f"no longer importable from bench.proxy: {missing}"
    assert bench_proxy.ManagedProcess is processes.ManagedProcess
    assert bench_proxy._headers is workloads.request_headers
    assert bench_proxy._wait_until_up is processes.wait_until_up
