"""A real, throw-away ``redis-server`` for the tests: started on a free loopback port with
persistence off, ready once it answers PING, stopped (and its directory removed) afterwards.

No fake: the Redis store is tested against the server it will run against. When
``redis-server`` is not installed :func:`find_redis_server` raises
:class:`RedisServerUnavailable` saying how to install it; the fixtures turn that into a
failure, not a skip, because CI installs it (``.ci/run``).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["RedisServer", "RedisServerUnavailable", "find_redis_server", "free_port"]

#: How long a starting server may take to answer PING.
START_TIMEOUT_S = 10.0
#: How many fresh ports to try when another process grabs the one we picked.
START_ATTEMPTS = 3

INSTALL_HINT = (
    "redis-server was not found on PATH; the Redis store tests need a real server. "
    "Install it (Debian/Ubuntu: apt-get install -y redis-server; macOS: brew install redis) "
    "— .ci/run installs it in CI"
)


class RedisServerUnavailable(RuntimeError):
    """``redis-server`` is not installed, or it did not start."""


def find_redis_server() -> str:
    """The path of the ``redis-server`` executable; raise with an install hint if missing."""
    path = shutil.which("redis-server")
    if path is None:
        raise RedisServerUnavailable(INSTALL_HINT)
    return path


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` subprocess on 127.0.0.1; use as a context manager, or call
    :meth:`start` and :meth:`stop`.

    Attributes:
        port: the port it listens on (0 until started).
        url: ``redis://127.0.0.1:<port>/0`` once started.
    """

    def __init__(self) -> None:
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None

    @property
    def url(self) -> str:
        """The URL of database 0 of the running server."""
        if self._proc is None:
            raise RuntimeError("the redis server is not running")
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> Self:
        """Start the server and wait until it answers PING; returns ``self``.

        Raises:
            RedisServerUnavailable: not installed, or it never answered (its log is quoted).
        """
        executable = find_redis_server()
        self._dir = Path(tempfile.mkdtemp(prefix="compact-proxy-redis-"))
        problem = ""
        for _ in range(START_ATTEMPTS):
            problem = self._try_start(executable, free_port())
            if not problem:
                return self
        self.stop()
        raise RedisServerUnavailable(f"redis-server did not start: {problem}")

    def _try_start(self, executable: str, port: int) -> str:
        """Start on ``port``; ``""`` when it answers PING, else what went wrong."""
        assert self._dir is not None
        log_path = self._dir / f"redis-{port}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [executable, "--save", "", "--appendonly", "no", "--port", str(port),
                 "--bind", "127.0.0.1", "--dir", str(self._dir), "--daemonize", "no"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if _answers_ping(port):
                self._proc, self.port = proc, port
                return ""
            time.sleep(0.05)
        _terminate(proc)
        tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-5:]
        return f"exit code {proc.returncode} on port {port}; log: " + " | ".join(tail)

    def stop(self) -> None:
        """Stop the server and remove its directory; idempotent."""
        if self._proc is not None:
            _terminate(self._proc)
            self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
