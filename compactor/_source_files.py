"""Open a source file beneath its root: no symbolic link followed, no way out of the root.

The root (the operator's setting, links allowed) is opened once per batch as a directory
descriptor, then the file relative to it in one step the kernel checks: ``openat2`` with
``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`` on Linux 5.6+ (through ``ctypes``: Python has no
binding, PyPI's ``pathrs`` needs a system Rust library), else an ``O_NOFOLLOW`` walk, one
component at a time. A link beneath the root is ``ELOOP``, a path leaving it ``EXDEV``. After
reading, the path is looked up again to tell a file removed or replaced meanwhile.
"""

from __future__ import annotations

import ctypes
import errno
import io
import os
import stat
import sys
from collections.abc import Callable
from typing import Final, Literal

__all__ = ["ContainedFile", "FileChecks", "Outcome", "open_beneath"]

_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
#: A directory opened only to look names up in it (Linux: ``O_PATH``, no read access needed).
_DIR_FLAGS: Final = getattr(os, "O_PATH", os.O_RDONLY) | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC
#: A source file: read only, never through a link, never blocking (a FIFO cannot hang us).
FILE_FLAGS: Final = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | _CLOEXEC

_SYS_OPENAT2: Final = 437  # the same number on every Linux architecture but alpha
_RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x02, 0x04, 0x08
_RESOLVE: Final = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS

ResolutionStatus = Literal["available", "missing", "denied", "corrupt", "unsupported"]


class Outcome(Exception):
    """Internal: ends a lookup early with a status (never escapes ``resolve``)."""

    def __init__(self, status: ResolutionStatus, detail: str) -> None:
        super().__init__(detail)
        self.status: ResolutionStatus = status
        self.detail = detail


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


class _Openat2:
    """``openat2`` through ``ctypes``, or None where it cannot be used (tried once)."""

    def __init__(self) -> None:
        self._syscall: Callable[..., int] | None = None
        self._usable: bool | None = None

    def __call__(self, dir_fd: int, relative: str, flags: int) -> int | None:
        """The descriptor, or None when ``openat2`` is not available here."""
        if self._usable is None:
            self._usable = self._probe()
        if not self._usable or self._syscall is None:
            return None
        syscall = self._syscall
        how = _OpenHow(flags, 0, _RESOLVE)
        path = os.fsencode(relative)
        for _ in range(8):  # EAGAIN: a rename elsewhere raced the lookup; it is safe to retry
            fd = syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dir_fd), ctypes.c_char_p(path),
                         ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
            if fd >= 0:
                return fd
            code = ctypes.get_errno()
            if code != errno.EAGAIN:
                raise OSError(code, os.strerror(code), relative)
        raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), relative)

    def _probe(self) -> bool:
        if sys.platform != "linux" or os.uname().machine.startswith("alpha"):
            return False
        try:
            syscall = self._syscall = ctypes.CDLL(None, use_errno=True).syscall
            root = os.open("/", _DIR_FLAGS)
        except (OSError, AttributeError):
            return False
        try:
            how = _OpenHow(_DIR_FLAGS, 0, _RESOLVE)
            fd = syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(root), ctypes.c_char_p(b"."),
                         ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
        finally:
            os.close(root)
        if fd < 0:  # ENOSYS (before 5.6), EPERM (a seccomp filter), ...
            return False
        os.close(fd)
        return True


_openat2 = _Openat2()


def _components(relative: str) -> list[str]:
    """The names of a plain relative path; anything that could leave the root: EXDEV."""
    names = relative.split("/")
    if not relative or any(name in ("", ".", "..") or "\0" in name for name in names):
        raise OSError(errno.EXDEV, "not a plain path beneath the root", relative)
    return names


def open_beneath(dir_fd: int, relative: str, flags: int = FILE_FLAGS) -> int:
    """Open ``relative`` beneath the directory ``dir_fd`` with ``flags``; an ``OSError``
    as the kernel says, ``ELOOP`` for a link, ``EXDEV`` for a path that is not plain."""
    names = _components(relative)
    fd = _openat2(dir_fd, relative, flags | _NOFOLLOW)
    if fd is not None:
        return fd
    return _walk(dir_fd, names, flags)


def _walk(dir_fd: int, names: list[str], flags: int) -> int:
    """The component-by-component ``O_NOFOLLOW`` walk (no ``openat2``)."""
    current = dir_fd
    try:
        for name in names[:-1]:
            try:
                step = os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=current)
            except NotADirectoryError:
                # O_DIRECTORY | O_NOFOLLOW on a link says ENOTDIR: tell the link apart.
                if stat.S_ISLNK(os.lstat(name, dir_fd=current).st_mode):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from None
                raise
            if current != dir_fd:
                os.close(current)
            current = step
        return os.open(names[-1], flags | _NOFOLLOW, dir_fd=current)
    finally:
        if current != dir_fd:
            os.close(current)


class FileChecks:
    """The disk checks of one batch of pointers, each made once: the roots' descriptors
    (closed on exit) and each file's open and ``fstat``. Local to one batch (one thread)."""

    __slots__ = ("_contained", "_roots")

    def __init__(self) -> None:
        self._roots: dict[str, int | OSError] = {}
        self._contained: dict[tuple[str, str], os.stat_result | Exception] = {}

    def __enter__(self) -> FileChecks:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for fd in self._roots.values():
            if isinstance(fd, int):
                os.close(fd)
        self._roots.clear()

    def root(self, root: str) -> int:
        """The descriptor of the directory ``root`` (its path's links followed)."""
        found = self._roots.get(root)
        if found is None:
            try:
                found = os.open(root, _DIR_FLAGS)
            except OSError as exc:
                found = exc
            self._roots[root] = found
        if isinstance(found, OSError):
            raise found
        return found

    def contained(self, root: str, relative: str) -> os.stat_result:
        """The ``fstat`` of the file at ``relative`` beneath ``root`` after
        :class:`ContainedFile`'s checks, or what they raised, again."""
        found = self._contained.get((root, relative))
        if found is None:
            try:
                with ContainedFile(root, relative, self) as opened:
                    found = opened.info
            except (Outcome, OSError) as exc:
                found = exc
            self._contained[root, relative] = found
        if isinstance(found, Exception):
            raise found
        return found


class ContainedFile:
    """Context manager: the regular file at ``relative`` beneath ``root``, with ``handle``
    (unbuffered) and ``info`` (its ``fstat``); a link, an escape or a second hard link is
    ``denied``, anything but a regular file ``corrupt``."""

    def __init__(self, root: str, relative: str, checks: FileChecks) -> None:
        self._root = root
        self._relative = relative
        self._checks = checks
        # Set by __enter__.
        self.handle: io.FileIO
        self.info: os.stat_result

    def __enter__(self) -> ContainedFile:
        fd = _open_contained(self._checks.root(self._root), self._relative, FILE_FLAGS)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise Outcome("corrupt", "not a regular file")
            if info.st_nlink > 1:
                # It may be another session's file, or one outside the root.
                raise Outcome("denied", "the file has more than one hard link")
            self.handle = io.FileIO(fd, "rb", closefd=True)
        except BaseException:
            os.close(fd)
            raise
        self.info = info
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.handle.close()

    def check_unchanged(self) -> None:
        """After reading: the path must still name the file that was read."""
        try:
            fd = _open_contained(self._checks.root(self._root), self._relative,
                                 getattr(os, "O_PATH", os.O_RDONLY) | _CLOEXEC)
        except FileNotFoundError:
            raise Outcome("missing", "file was removed while being read") from None
        except Outcome:
            raise Outcome("corrupt", "file was replaced while being read") from None
        try:
            now = os.fstat(fd)
        finally:
            os.close(fd)
        if (now.st_dev, now.st_ino) != (self.info.st_dev, self.info.st_ino):
            raise Outcome("corrupt", "file was replaced while being read")


def _open_contained(root_fd: int, relative: str, flags: int) -> int:
    """:func:`open_beneath`, a link or an escape turned into ``denied``."""
    try:
        return open_beneath(root_fd, relative, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Outcome("denied", "a symbolic link beneath the source root (never "
                                    "followed)") from None
        if exc.errno == errno.EXDEV:
            raise Outcome("denied", "path leads outside the source root") from None
        raise
