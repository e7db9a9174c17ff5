"""Files that hold durable state kept private to the proxy's user, whatever the umask.

The SQLite file (and its ``-wal``, ``-shm``) is created ``0600`` in directories created ``0700``;
an existing one others may read is narrowed. Existing directories, and files the proxy may not
change the mode of, are the operator's (docs/operations.md, "Config notes").
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Final

__all__ = ["COMPANION_SUFFIXES", "FILE_MODE", "DIRECTORY_MODE", "private_companions",
           "private_file"]

#: The mode of a state file the proxy creates.
FILE_MODE: Final = 0o600
#: The mode of a directory the proxy creates for one.
DIRECTORY_MODE: Final = 0o700
#: The files SQLite keeps next to a database (write-ahead log, its index, a rollback journal).
COMPANION_SUFFIXES: Final = ("-wal", "-shm", "-journal")


def private_file(path: Path) -> None:
    """Make sure ``path`` exists and only its owner may read it: its missing parent
    directories created ``0700``, the file ``0600`` (an existing one narrowed)."""
    _private_directories(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        _narrow(path)
        return
    try:
        os.fchmod(fd, FILE_MODE)  # the umask may have taken bits from the mode asked for
    finally:
        os.close(fd)


def private_companions(path: Path) -> None:
    """Narrow the companion files of the database ``path`` that exist."""
    for suffix in COMPANION_SUFFIXES:
        _narrow(path.with_name(path.name + suffix))


def _private_directories(directory: Path) -> None:
    missing = []
    while not directory.exists():
        missing.append(directory)
        if directory.parent == directory:
            break
        directory = directory.parent
    for each in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            os.mkdir(each, DIRECTORY_MODE)
            os.chmod(each, DIRECTORY_MODE)


def _narrow(path: Path) -> None:
    """Drop the group's and others' bits of ``path``, if it has any and may be changed."""
    with contextlib.suppress(OSError):
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o077:
            os.chmod(path, mode & 0o700)
