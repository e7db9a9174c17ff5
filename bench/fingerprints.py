"""CPU of fingerprinting a real conversation: this version against a baseline commit's.

Every message of a corpus conversation is fingerprinted as a cold request does (freshly
decoded objects, so no string hash is cached yet); a warm request does the same for its new
messages only. The baseline's ``compactor/_fingerprint.py`` is read from git and run beside
this one; where it has ``stable_digest`` (the per-process fingerprints' stand-in in the
store), the cost of fingerprint plus digest is shown too, as a checkpoint needed both for a
message it covered.

    python -m bench.fingerprints --baseline 86adb39
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compactor import _fingerprint as current

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus" / "real"
CONVERSATION = "cctrace__phase0-investigation__132b2f66-ee5f-46f6-8904-32d9dc4d36c3.json"


def baseline(ref: str) -> types.ModuleType:
    """``compactor/_fingerprint.py`` as it was at ``ref``."""
    source = subprocess.run(["git", "show", f"{ref}:compactor/_fingerprint.py"], cwd=REPO,
                            check=True, capture_output=True, text=True).stdout
    module = types.ModuleType(f"fingerprint_{ref}")
    exec(compile(source, f"{ref}:compactor/_fingerprint.py", "exec"), module.__dict__)
    return module


def cpu_ms(raw: bytes, work: Callable[[list[Any]], object]) -> float:
    """Process CPU of ``work`` over freshly decoded messages (decoding not counted), ms."""
    messages = json.loads(raw)["messages"]
    start = time.process_time()
    work(messages)
    return (time.process_time() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="86adb39", help="commit to compare with")
    parser.add_argument("--conversation", default=CONVERSATION, help="corpus file name")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    raw = (CORPUS / args.conversation).read_bytes()
    old = baseline(args.baseline)
    count = len(json.loads(raw)["messages"])
    rows: list[tuple[str, Callable[[list[Any]], object]]] = [
        (f"{args.baseline} fingerprint", lambda ms: [old.fingerprint(m) for m in ms]),
        ("this fingerprint", lambda ms: [current.fingerprint(m) for m in ms]),
    ]
    if hasattr(old, "stable_digest"):
        rows.append((f"{args.baseline} fingerprint + stable_digest",
                     lambda ms: [(old.fingerprint(m), old.stable_digest(m)) for m in ms]))
    print(f"{args.conversation}: {count} messages, {len(raw) / 1e3:.0f} KB; "
          f"process CPU over {args.repeats} runs (median, min)")
    times: dict[str, list[float]] = {name: [] for name, _ in rows}
    for _ in range(args.repeats):  # (interleaved: each sees the same machine)
        for name, work in rows:
            times[name].append(cpu_ms(raw, work))
    for name, found in times.items():
        print(f"  {name:40s} {statistics.median(found):6.2f} ms  {min(found):6.2f} ms")


if __name__ == "__main__":
    main()
