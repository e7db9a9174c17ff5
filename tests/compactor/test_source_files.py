"""Opening a source beneath its root (``compactor._source_files``): no link followed, no way
out, by ``openat2`` and by the ``O_NOFOLLOW`` walk alike, on real files under tmp_path."""

from __future__ import annotations

import errno
import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from compactor import SourcePointerResolver, _source_files
from compactor._source_files import open_beneath

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX descriptors and links")

INSIDE = b"inside the root\n"
OUTSIDE = b"outside the root\n"


@pytest.fixture(params=["openat2", "walk"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs once with ``openat2`` (where the kernel has it) and once with the walk
    (as on a kernel without it)."""
    if request.param == "openat2":
        if not _source_files._Openat2()._probe():
            pytest.skip("no openat2 here (Linux 5.6 or later)")
    else:
        monkeypatch.setattr(_source_files._openat2, "_usable", False)
    return str(request.param)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[int]:
    """A root ``r`` holding ``s1/report.txt`` and ``top.txt``, beside ``outside/``; its
    descriptor."""
    (tmp_path / "r" / "s1").mkdir(parents=True)
    (tmp_path / "r" / "s1" / "report.txt").write_bytes(INSIDE)
    (tmp_path / "r" / "top.txt").write_bytes(INSIDE)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "report.txt").write_bytes(OUTSIDE)
    fd = os.open(tmp_path / "r", os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def read(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


def refusal(root: int, relative: str) -> int:
    """The errno ``open_beneath`` refuses ``relative`` with."""
    with pytest.raises(OSError) as caught:
        os.close(open_beneath(root, relative))
    assert caught.value.errno is not None
    return caught.value.errno


def test_a_file_beneath_the_root_opens(way: str, root: int) -> None:
    assert read(open_beneath(root, "s1/report.txt")) == INSIDE
    assert read(open_beneath(root, "top.txt")) == INSIDE


@pytest.mark.parametrize("relative", ["..", "../outside/report.txt", "s1/../top.txt",
                                      "s1/../../outside/report.txt", "./top.txt", "s1//report.txt",
                                      "", "/etc/hostname", "s1/report.txt/"])
def test_dot_dot_and_anything_but_a_plain_path_is_refused(way: str, root: int,
                                                          relative: str) -> None:
    """``..`` is refused even where it would stay inside: EXDEV, by both ways."""
    assert refusal(root, relative) == errno.EXDEV


def test_a_link_as_the_file_is_refused_wherever_it_points(way: str, root: int,
                                                         tmp_path: Path) -> None:
    (tmp_path / "r" / "out.txt").symlink_to(tmp_path / "outside" / "report.txt")
    (tmp_path / "r" / "in.txt").symlink_to("top.txt")
    (tmp_path / "r" / "dangling.txt").symlink_to("nowhere")
    for name in ("out.txt", "in.txt", "dangling.txt"):
        assert refusal(root, name) == errno.ELOOP, name


def test_a_link_as_a_folder_beneath_the_root_is_refused(way: str, root: int,
                                                       tmp_path: Path) -> None:
    """A session folder that is a link (out of the root, or to a folder inside it)."""
    (tmp_path / "r" / "s2").symlink_to(tmp_path / "outside", target_is_directory=True)
    (tmp_path / "r" / "s3").symlink_to("s1", target_is_directory=True)
    assert refusal(root, "s2/report.txt") == errno.ELOOP
    assert refusal(root, "s3/report.txt") == errno.ELOOP


def test_missing_and_not_a_folder_are_told_as_the_kernel_says(way: str, root: int) -> None:
    assert refusal(root, "s1/absent.txt") == errno.ENOENT
    assert refusal(root, "absent/report.txt") == errno.ENOENT
    assert refusal(root, "top.txt/report.txt") == errno.ENOTDIR


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="openat2 is Linux's")
def test_openat2_is_the_way_on_a_kernel_that_has_it() -> None:
    """On Linux 5.6 or later (this machine's, CI's) the kernel checks the whole path."""
    major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    if (major, minor) < (5, 6):
        pytest.skip("Linux before 5.6")
    assert _source_files._Openat2()._probe()


def test_the_resolver_denies_links_and_reads_plain_files_both_ways(way: str,
                                                                  tmp_path: Path) -> None:
    """End to end through the resolver: a folder link and a file link beneath the root are
    denied; the plain artifact is available."""
    aroot = tmp_path / "a"
    (aroot / "s1").mkdir(parents=True)
    (aroot / "s1" / "report.txt").write_bytes(INSIDE)
    (aroot / "s1" / "alias.txt").symlink_to("report.txt")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "report.txt").write_bytes(OUTSIDE)
    (aroot / "s2").symlink_to(tmp_path / "outside", target_is_directory=True)
    resolver = SourcePointerResolver(tmp_path / "t", aroot, lambda p: True)
    inside, outside = (hashlib.sha256(b).hexdigest() for b in (INSIDE, OUTSIDE))
    statuses = [r.status for r in resolver.resolve_all([
        f"artifact:s1:report.txt:{inside}", f"artifact:s1:alias.txt:{inside}",
        f"artifact:s2:report.txt:{outside}"])]
    assert statuses == ["available", "denied", "denied"]
