"""A real, throw-away S3-compatible server for the tests: ``moto`` in server mode
(``python -m moto.server``), a separate process on a free loopback port, ready once it answers
HTTP, stopped afterwards. Its objects live in that process, so a test that measures the
memory of a resolver reading a large object measures the resolver only.

No in-process mock: the S3 resolver talks HTTP to a server, signs its requests and streams
its answers as it would against any S3-compatible service.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from types import TracebackType
from typing import Self

from tests.redis_server import free_port

__all__ = ["MotoServer", "MotoServerUnavailable"]

#: How long a starting server may take to answer.
START_TIMEOUT_S = 20.0


class MotoServerUnavailable(RuntimeError):
    """moto's server could not be started (``moto[server]`` is in the ``test`` extra)."""


class MotoServer:
    """``python -m moto.server`` on ``127.0.0.1:<free port>``."""

    def __init__(self) -> None:
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The endpoint URL (``http://127.0.0.1:<port>``)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the server and wait until it answers HTTP."""
        self.port = free_port()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise MotoServerUnavailable(
                    f"moto's server exited with {self._process.returncode}; is moto[server] "
                    "installed (pip install -e '.[test]')?")
            try:
                with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1):
                    return
            except urllib.error.HTTPError:
                return  # it answers
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise MotoServerUnavailable(f"moto's server did not answer within {START_TIMEOUT_S}s")

    def stop(self) -> None:
        """Stop the server."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
