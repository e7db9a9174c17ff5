"""Compaction time for 100 KB, 1 MB and 4 MB agent histories, cold and warm.

Cold: a fresh token cache. Warm: the same cache, and the history grown by one exchange (what
the next request of a session looks like). The soft threshold is set to half of each
history's size so every layer up to L3 does real work; L4 answers from a stub summariser
(the model call itself is the proxy's, not the library's, and is not timed here).

    python bench/compaction.py [--counter tiktoken|chars4] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from compactor import (
    CachingCounter,
    Chars4Counter,
    CompactionOptions,
    TiktokenCounter,
    compact_context,
    estimate_tokens,
)
from policies import CompactionPolicy


def synthetic_history(target_bytes: int, seed: int = 7) -> list[dict[str, Any]]:
    """A coding-agent session: shell calls with logs, repeated file reads, some big outputs."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Make the test suite pass."}]
    n = 0
    size = 0
    while size < target_bytes:
        n += 1
        if n % 5 == 0:
            use = {"type": "tool_use", "id": f"toolu_{n:06d}", "name": "Read",
                   "input": {"file_path": f"/repo/src/module_{n % 7}.py"}}
            result = "".join(f"{i:4d}\tdef function_{i}(x):  # module {n % 7} v{n}\n"
                             for i in range(120))
        elif n % 11 == 0:
            use = {"type": "tool_use", "id": f"toolu_{n:06d}", "name": "Bash",
                   "input": {"command": "pytest -x -q"}}
            result = "".join(f"tests/test_{i}.py::test_case_{n} PASSED [{i % 100}%]\n"
                             for i in range(1_500))
        else:
            use = {"type": "tool_use", "id": f"toolu_{n:06d}", "name": "Bash",
                   "input": {"command": f"grep -rn pattern_{n} src/"}}
            result = "".join(f"src/file_{i}.py:{i * 3}: match pattern_{n} here\n"
                             for i in range(30))
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Step {n}: checking the next thing."}, use]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use["id"], "content": result}]})
        size += len(result) + 200
    messages[-1]["content"].append({"type": "text", "text": "Continue."})
    return messages


def grow(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    n = len(messages)
    return [*messages,
            {"role": "assistant", "content": [{"type": "text", "text": "One more."},
                                              {"type": "tool_use", "id": f"toolu_x{n}",
                                               "name": "Bash",
                                               "input": {"command": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_x{n}",
                                          "content": "a\nb\nc"}]}]


def run(counter_name: str, repeat: int) -> None:
    make = TiktokenCounter if counter_name == "tiktoken" else Chars4Counter
    print(f"counter={counter_name}  (median of {repeat} runs, ms)")
    print(f"{'history':>9} {'messages':>9} {'tokens':>9} {'cold':>8} {'warm':>8}  layers")
    for label, target in (("100 KB", 100_000), ("1 MB", 1_000_000), ("4 MB", 4_000_000)):
        history = synthetic_history(target)
        actual = len(json.dumps(history))
        tokens = estimate_tokens(history, CachingCounter(make()))
        policy = CompactionPolicy(soft_threshold_tokens=tokens // 2, hard_limit_tokens=tokens * 2,
                                  max_tool_result_tokens=2_000)
        colds, warms = [], []
        layers: tuple[str, ...] = ()
        for _ in range(repeat):
            counter = CachingCounter(make())
            fresh = json.loads(json.dumps(history))  # a request parses anew: no cached str hashes
            start = time.perf_counter()
            result = compact_context(fresh, None, policy=policy, counter=counter,
                                     summarizer=lambda s: "summary",
                                     options=CompactionOptions(copy=False))
            colds.append((time.perf_counter() - start) * 1000)
            grown = json.loads(json.dumps(grow(history)))
            start = time.perf_counter()
            compact_context(grown, None, policy=policy, counter=counter,
                            summarizer=lambda s: "summary",
                                     options=CompactionOptions(copy=False))
            warms.append((time.perf_counter() - start) * 1000)
            layers = result.layers_applied
        print(f"{label:>9} {len(history):>9} {tokens:>9} {statistics.median(colds):>8.1f} "
              f"{statistics.median(warms):>8.1f}  {','.join(layers)}  ({actual / 1e6:.2f} MB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counter", choices=("tiktoken", "chars4", "both"), default="both")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for name in (("tiktoken", "chars4") if args.counter == "both" else (args.counter,)):
        run(name, args.repeat)


if __name__ == "__main__":
    main()
