"""``tune_allocator`` fixes glibc's thresholds, so a large body's memory is reused, not
mapped afresh on every request. Each check runs in a child process: the settings are the
process's own and last as long as it does."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                                reason="the thresholds are glibc's")

BODY = 2_600_000  # bytes: the benchmark's largest warm history
ROUNDS = 20

# Puts the process in the state about half of the processes reached by chance: every block
# of 128 KiB or more gets its own mapping, so each new body faults its pages in again.
_CHILD = f"""
import ctypes, json, resource, sys
from proxy.server.allocator import tune_allocator

def faults_per_body():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range({ROUNDS}):
        body = b"x" * {BODY}
        del body
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / {ROUNDS}

if sys.argv[1] == "unlucky":
    assert ctypes.CDLL(None).mallopt(-3, 128 * 1024) == 1
faults_per_body()  # what the first bodies map stays mapped in the lucky cases
before = faults_per_body()
result = tune_allocator()
faults_per_body()
print(json.dumps({{"result": result, "before": before, "after": faults_per_body()}}))
"""


def child(state: str, **env: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", _CHILD, state], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=60, check=True)
    found: dict[str, Any] = json.loads(out.stdout)
    return found


def test_an_unlucky_process_stops_faulting_its_bodies_in() -> None:
    """A 2.6 MB body faulted in ~635 pages a time before; after the tuning, almost none."""
    seen = child("unlucky")
    assert seen["result"] == "fixed"
    assert seen["before"] > BODY / 4096 / 2
    assert seen["after"] < 10


def test_a_threshold_the_operator_set_is_left_alone() -> None:
    """``MALLOC_TRIM_THRESHOLD_`` in the environment: glibc's own setting wins, nothing is
    changed (the unlucky state stays, faults and all)."""
    seen = child("unlucky", MALLOC_TRIM_THRESHOLD_="131072")
    assert seen["result"] == "operator"
    assert seen["after"] > BODY / 4096 / 2
