"""Message fingerprints, and what the store keeps by them, are the same in processes with
other ``PYTHONHASHSEED`` values: a real corpus conversation fingerprinted in subprocesses;
a calibration snapshot and a checkpoint made in one, used in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from compactor import CachingCounter, Chars4Counter, CompactionCheckpoint, message_facts
from compactor._fingerprint import fingerprint
from proxy.calibration.local import Calibration
from tests.paths import CORPUS

REPO = Path(__file__).resolve().parents[3]
CONVERSATION = CORPUS / "m-claude__343e3472-b9b6-4561-ade0-21d1a4730c11.json"
MODEL = "claude-sonnet-4-5"
SEEDS = ("0", "1", "4242", "random")

# Run in a subprocess: reads the conversation, writes what the test asks of it.
SCRIPT = """
import json, sys
from compactor import CachingCounter, Chars4Counter, CompactionCheckpoint, message_facts
from compactor._fingerprint import fingerprint
from proxy.calibration.local import Calibration

body = json.load(open(sys.argv[1], encoding="utf-8"))
messages = body["messages"]
what = sys.argv[2]
if what == "prints":
    print(json.dumps([fingerprint(m) for m in messages] + [fingerprint(body["tools"])]))
elif what == "snapshot":
    facts = message_facts(messages, CachingCounter(Chars4Counter()))
    prints, tokens = [f.fingerprint for f in facts], [f.tokens for f in facts]
    calibration = Calibration()
    counted = 500 + sum(tokens)
    calibration.observe("s", sys.argv[3], counted, round(counted * 1.3), 500, prints, tokens)
    sys.stdout.buffer.write(calibration.snapshot("s", sys.argv[3]))
elif what == "checkpoint":
    cut = len(messages) // 2
    sys.stdout.buffer.write(CompactionCheckpoint.build(
        messages[:cut], messages[:2], "policy", ("L4",)).to_bytes())
"""


def in_process(seed: str, *args: str) -> bytes:
    """What :data:`SCRIPT` writes for ``args`` in a Python started with ``seed``."""
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(CONVERSATION), *args], cwd=REPO,
                          env=env, check=True, capture_output=True)
    return done.stdout


def conversation() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(CONVERSATION.read_text(encoding="utf-8"))
    return body


def test_a_conversations_fingerprints_are_the_same_under_every_hash_seed() -> None:
    body = conversation()
    here = [fingerprint(m) for m in body["messages"]] + [fingerprint(body["tools"])]
    assert len(set(here)) == len(here)  # (distinct messages, distinct fingerprints)
    for seed in SEEDS:
        assert json.loads(in_process(seed, "prints")) == here, f"PYTHONHASHSEED={seed}"


def test_a_snapshot_made_under_another_seed_brings_each_messages_count() -> None:
    """The per-message counts another replica learnt are keyed by fingerprints this process
    computes too: restored, every message of the conversation has its count."""
    data = in_process("1", "snapshot", MODEL)
    calibration = Calibration()
    assert calibration.restore("s", MODEL, data)
    known = calibration.known("s", MODEL)
    facts = message_facts(conversation()["messages"], CachingCounter(Chars4Counter()))
    assert known and all(f is not None and f.fingerprint in known for f in facts)


def test_a_snapshot_of_the_format_before_is_not_read() -> None:
    """Format 1 held fingerprints salted by the process that made them: refused whole."""
    one = Calibration()
    one.observe("s", MODEL, 1000, 1300, 100, [1, 2], [400, 500])
    data = bytearray(one.snapshot("s", MODEL) or b"")
    data[0] = 1
    assert not Calibration().restore("s", MODEL, bytes(data))


def test_a_checkpoint_made_under_another_seed_matches_here() -> None:
    data = in_process("2", "checkpoint")
    checkpoint = CompactionCheckpoint.from_bytes(data)
    messages = conversation()["messages"]
    assert checkpoint is not None and checkpoint.covered == len(messages) // 2
    assert checkpoint.matches(messages, [fingerprint(m) for m in messages])
