"""Source-pointer tricks that ``tests/compactor/test_resolver_*.py`` does not cover (hard links,
links into another session's files), and the end-to-end check that a forged pointer written
through the admin API renders as denied / missing in the system block the provider gets.

Containment is per session: a symbolic or hard link planted in session s1's folder never
yields ``available`` evidence for s2's (or an outside) file.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import compactor
from compactor import _source_files
from policies import SourceAccessPolicy
from tests.conftest import ProxyFactory, UpstreamServer, user_text
from tests.reliability.conftest import RELIABILITY_ADMIN_TOKEN

SECRET = b"s2's private numbers\n"
SECRET_SHA = hashlib.sha256(SECRET).hexdigest()
OUTSIDE = b"a file outside every root\n"
OUTSIDE_SHA = hashlib.sha256(OUTSIDE).hexdigest()
def event(seq: int, session: str) -> str:
    """One transcript line."""
    return json.dumps({"sequence": seq, "session_id": session, "event_id": f"e{seq}"})


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    """Transcript and artifact roots with session s2's files and an outside file."""
    troot, aroot = tmp_path / "t", tmp_path / "a"
    (aroot / "s1").mkdir(parents=True)
    (aroot / "s2").mkdir(parents=True)
    troot.mkdir()
    (aroot / "s2" / "secret.txt").write_bytes(SECRET)
    (troot / "s2.jsonl").write_text(event(1, "s2") + "\n")
    (tmp_path / "outside.txt").write_bytes(OUTSIDE)
    return troot, aroot


def resolve_as_s1(roots: tuple[Path, Path], pointer: str) -> compactor.SourceResolution:
    """Resolve ``pointer`` for session s1 under the default (own-session) policy."""
    authorize = SourceAccessPolicy().authorizer("s1")
    return compactor.SourcePointerResolver(str(roots[0]), str(roots[1]), authorize).resolve(pointer)


def test_another_sessions_pointer_is_denied(roots: tuple[Path, Path]) -> None:
    """s1 naming s2's artifact or transcript directly: denied, no evidence."""
    for pointer in (f"artifact:s2:secret.txt:{SECRET_SHA}", "transcript:s2:1"):
        result = resolve_as_s1(roots, pointer)
        assert (result.status, result.evidence_sha256) == ("denied", None)


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_transcript_linked_to_another_sessions_is_never_available(
    roots: tuple[Path, Path], link: str
) -> None:
    """s1.jsonl as a link to s2.jsonl: its events name s2, so it is not s1's evidence."""
    target, planted = roots[0] / "s2.jsonl", roots[0] / "s1.jsonl"
    (planted.symlink_to if link == "symlink" else planted.hardlink_to)(target)
    result = resolve_as_s1(roots, "transcript:s1:1")
    assert result.status != "available" and result.evidence_sha256 is None


def test_artifact_hardlink_to_another_sessions_file_is_not_available(
    roots: tuple[Path, Path]
) -> None:
    """A hard link in s1's folder to s2's file must not give s1 evidence of s2's data."""
    os.link(roots[1] / "s2" / "secret.txt", roots[1] / "s1" / "copy.txt")
    result = resolve_as_s1(roots, f"artifact:s1:copy.txt:{SECRET_SHA}")
    assert result.status != "available"


def test_artifact_hardlink_to_a_file_outside_the_root_is_not_available(
    roots: tuple[Path, Path], tmp_path: Path
) -> None:
    """A hard link to a file outside every root (a link out of the root) must be refused."""
    os.link(tmp_path / "outside.txt", roots[1] / "s1" / "out.txt")
    result = resolve_as_s1(roots, f"artifact:s1:out.txt:{OUTSIDE_SHA}")
    assert result.status != "available"


def test_artifact_symlink_to_another_sessions_file_is_not_available(
    roots: tuple[Path, Path]
) -> None:
    """A symlink in s1's folder to ../s2/secret.txt stays inside the root, yet is s2's."""
    (roots[1] / "s1" / "alias.txt").symlink_to(Path("..") / "s2" / "secret.txt")
    result = resolve_as_s1(roots, f"artifact:s1:alias.txt:{SECRET_SHA}")
    assert result.status != "available"


def test_transcript_symlink_to_another_sessions_transcript_is_denied(
    roots: tuple[Path, Path]
) -> None:
    """s1.jsonl linked to s2.jsonl (inside the root) is another session's file: denied."""
    (roots[0] / "s2.jsonl").write_text(event(1, "s2") + "\n")
    (roots[0] / "s1.jsonl").symlink_to(roots[0] / "s2.jsonl")
    assert resolve_as_s1(roots, "transcript:s1:1").status == "denied"


def test_session_folder_symlinked_to_another_sessions_folder_is_denied(
    roots: tuple[Path, Path]
) -> None:
    """An s3 folder that is a link to s2's folder gives s3 nothing of s2's."""
    (roots[1] / "s3").symlink_to(roots[1] / "s2", target_is_directory=True)
    resolver = compactor.SourcePointerResolver(roots[0], roots[1], lambda p: True)
    assert resolver.resolve(f"artifact:s3:secret.txt:{SECRET_SHA}").status == "denied"


# -- end to end: a forged pointer in an admin PUT ------------------------------------------


async def forged_state_system_block(proxy_factory: ProxyFactory, upstream_server: UpstreamServer,
                                    overrides: dict[str, Any]) -> str:
    """PUT a state for s1 whose pointers name s2's files, a traversal and a missing file,
    send one message as s1, and return the system text the provider received."""
    proxy = proxy_factory(overrides, admin_token=RELIABILITY_ADMIN_TOKEN)
    (proxy.artifact_root / "s2").mkdir()
    (proxy.artifact_root / "s2" / "secret.txt").write_bytes(SECRET)
    (proxy.transcript_root / "s2.jsonl").write_text(event(1, "s2") + "\n")
    when = "2025-03-01T12:00:00Z"
    pointers = {"f-cross-artifact": f"artifact:s2:secret.txt:{SECRET_SHA}",
                "f-cross-transcript": "transcript:s2:1",
                "f-missing": f"artifact:s1:nothing.txt:{SECRET_SHA}"}
    state = {"facts": [{"fact_id": k, "content": f"forged {k}", "source_pointer": v,
                        "last_confirmed_at": when} for k, v in pointers.items()],
             "pending_items": [], "retrieval_evidence": []}
    auth = {"Authorization": f"Bearer {RELIABILITY_ADMIN_TOKEN}"}
    async with aiohttp.ClientSession() as http:
        async with http.put(f"{proxy.base_url}/admin/sessions/s1/state", json=state,
                            headers=auth) as resp:
            assert resp.status == 201, await resp.text()
        forged = f"artifact:s1:../s2/secret.txt:{SECRET_SHA}"
        traversal = {**state, "facts": [{**state["facts"][0], "fact_id": "f-traversal",
                                         "source_pointer": forged}]}
        async with http.put(f"{proxy.base_url}/admin/sessions/s1b/state", json=traversal,
                            headers=auth) as resp:
            traversal_status = resp.status
        body = {"model": "claude-sonnet-4-5", "max_tokens": 8,
                "messages": [{"role": "user", "content": user_text("what do you know?")}]}
        async with http.post(f"{proxy.base_url}/v1/messages", json=body,
                             headers={"x-api-key": "k", "x-compact-session-id": "s1"}) as resp:
            assert resp.status == 200
    # A traversal is either refused at the door or stored and rendered as denied.
    assert traversal_status in (201, 400)
    system = upstream_server.upstream.message_requests[-1].body["system"]
    text: str = system[-1]["text"]
    return text


def item_line(block: str, item_id: str) -> str:
    """The rendered line(s) of one item."""
    lines = [line for line in block.splitlines() if item_id in line]
    assert lines, block
    return " ".join(lines)


async def test_forged_pointers_in_an_admin_put_render_as_denied_or_missing(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """Default policy: s2's files named in s1's state show denied, a missing one missing; no
    evidence digest of s2's file reaches the provider."""
    block = await forged_state_system_block(proxy_factory, upstream_server, {})
    assert "evidence_sha256=" not in block
    for item in ("f-cross-artifact", "f-cross-transcript"):
        assert "source_status=denied evidence_unavailable=true" in item_line(block, item)
    assert "source_status=missing evidence_unavailable=true" in item_line(block, "f-missing")
    assert "available" not in block.replace("evidence_unavailable", "")


async def test_cross_session_sources_resolve_only_when_the_policy_allows(
    proxy_factory: ProxyFactory, upstream_server: UpstreamServer
) -> None:
    """``policies.source_access.allow_cross_session: true``: the same pointers are verified."""
    block = await forged_state_system_block(
        proxy_factory, upstream_server,
        {"policies": {"source_access": {"allow_cross_session": True}}})
    assert f"source_status=available evidence_sha256={SECRET_SHA}" in item_line(
        block, "f-cross-artifact")
    assert "source_status=available" in item_line(block, "f-cross-transcript")
    assert "source_status=missing" in item_line(block, "f-missing")


# -- a folder swapped while a pointer resolves ------------------------------------------------

_SWAPPER = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
a, b, seconds = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2]), float(sys.argv[3])
AT_FDCWD, RENAME_EXCHANGE = -100, 2
print("ready", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(1000):
        if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
            sys.exit("renameat2: " + os.strerror(ctypes.get_errno()))
"""

#: How long the race runs (the swap is won well within it by a check-then-open resolver).
RACE_SECONDS = 4.0


def _has_rename_exchange(folder: Path) -> bool:
    """Whether this libc and filesystem can exchange two names (renameat2 RENAME_EXCHANGE)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        return False
    (folder / "x1").mkdir()
    (folder / "x2").symlink_to("x1")
    done = libc.renameat2(-100, os.fsencode(folder / "x1"), -100, os.fsencode(folder / "x2"),
                          2) == 0
    return done and (folder / "x1").is_symlink()


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="renameat2 is Linux's")
@pytest.mark.parametrize("way", ["openat2", "walk"])
def test_a_session_folder_swapped_for_a_link_never_yields_the_outside_file(
    roots: tuple[Path, Path], tmp_path: Path, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session folder exchanged, as fast as the kernel allows, with a link to a folder
    outside the root (``renameat2(RENAME_EXCHANGE)`` from another process) while its
    artifact is resolved over and over: the outside file's digest is never ``available``,
    whether the kernel checks the path (``openat2``) or the resolver walks it. A resolver
    that checks the real path and then opens the path again loses this race in a second."""
    if not _has_rename_exchange(tmp_path):
        pytest.skip("no renameat2(RENAME_EXCHANGE) here")
    if way == "walk":
        monkeypatch.setattr(_source_files._openat2, "_usable", False)
    outside = tmp_path / "outside-dir"
    outside.mkdir()
    (outside / "report.txt").write_bytes(OUTSIDE)
    (roots[1] / "s1" / "report.txt").write_bytes(b"s1's own report\n")
    (roots[1] / "swap").symlink_to(outside, target_is_directory=True)
    resolver = compactor.SourcePointerResolver(roots[0], roots[1], lambda p: True,
                                               cache_entries=0)
    pointer = f"artifact:s1:report.txt:{OUTSIDE_SHA}"
    swapper = subprocess.Popen(
        [sys.executable, "-c", _SWAPPER, str(roots[1] / "s1"), str(roots[1] / "swap"),
         str(RACE_SECONDS)], stdout=subprocess.PIPE, text=True)
    leaks, tries, seen = 0, 0, set()
    try:
        assert swapper.stdout is not None and swapper.stdout.readline() == "ready\n"
        end = time.monotonic() + RACE_SECONDS
        while time.monotonic() < end and not leaks:
            tries += 1
            result = resolver.resolve(pointer)
            seen.add(result.status)
            leaks += result.status == "available" or result.evidence_sha256 is not None
    finally:
        swapper.kill()
        swapper.wait()
    assert leaks == 0, f"the outside file was read through the swapped folder ({tries} tries)"
    # The race was run: the folder was seen as the link (denied) and as itself (corrupt: s1's
    # own report has another digest).
    assert tries > 100 and {"denied", "corrupt"} <= seen, (tries, seen)
