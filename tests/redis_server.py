"""A real, throw-away ``redis-server`` for the tests: started on a free loopback port with
persistence off (or, for a server the tests stop and start again, an append-only file
synced on every write), ready once it answers PING, stopped (and its directory removed)
afterwards; a throw-away three-master Redis Cluster of three such servers
(:class:`RedisClusterServers`), created with ``redis-cli --cluster create``; and a Redis
Sentinel (``redis-server --sentinel``) watching one of them (:class:`RedisSentinel`).

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

__all__ = [
    "RedisClusterServers",
    "RedisSentinel",
    "RedisServer",
    "RedisServerUnavailable",
    "find_redis_server",
    "free_port",
]

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
            return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))  # (up, wants a password)
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` subprocess on 127.0.0.1; use as a context manager, or call
    :meth:`start` and :meth:`stop`.

    Args:
        persistent: keep the data in an append-only file synced on every write, so the
            server can be killed (:meth:`kill`) and started again (:meth:`restart`) with it.
        extra_args: more ``redis-server`` options (each ``--name`` then its values).

    Attributes:
        port: the port it listens on (0 until started).
        url: ``redis://127.0.0.1:<port>/0`` once started.
    """

    def __init__(self, *, persistent: bool = False, extra_args: tuple[str, ...] = ()) -> None:
        self.port = 0
        self.persistent = persistent
        self.extra_args = extra_args
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

    def kill(self) -> None:
        """Kill the server (SIGKILL, no shutdown), keeping its port and data directory."""
        if self._proc is None:
            raise RuntimeError("the redis server is not running")
        self._proc.kill()
        self._proc.wait(timeout=5)
        self._proc = None

    def restart(self) -> None:
        """Start the server again on its port, on its data (after :meth:`kill`).

        Raises:
            RedisServerUnavailable: it did not answer (its port was taken meanwhile, ...).
        """
        if self._proc is not None or self._dir is None:
            raise RuntimeError("restart() follows kill()")
        deadline = time.monotonic() + START_TIMEOUT_S
        problem = ""
        while time.monotonic() < deadline:  # the killed server's port may linger briefly
            problem = self._try_start(find_redis_server(), self.port)
            if not problem:
                return
            time.sleep(0.1)
        raise RedisServerUnavailable(f"redis-server did not restart: {problem}")

    def _try_start(self, executable: str, port: int) -> str:
        """Start on ``port``; ``""`` when it answers PING, else what went wrong."""
        assert self._dir is not None
        log_path = self._dir / f"redis-{port}.log"
        persistence = (["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
                       if self.persistent else ["--save", "", "--appendonly", "no"])
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                [executable, *persistence, "--port", str(port), "--bind", "127.0.0.1",
                 "--dir", str(self._dir), "--daemonize", "no", *self.extra_args],
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


class RedisClusterServers:
    """A three-master Redis Cluster on loopback ports (no replicas), for the tests; use as a
    context manager, or call :meth:`start` and :meth:`stop`.

    Attributes:
        nodes: the three servers (each a master of about a third of the slots).
        url: the URL of the first node: a cluster client finds the others from it.
    """

    def __init__(self, masters: int = 3) -> None:
        self.nodes = [RedisServer(extra_args=("--cluster-enabled", "yes",
                                              "--cluster-config-file", "nodes.conf",
                                              "--cluster-port", str(free_port())))
                      for _ in range(masters)]

    @property
    def url(self) -> str:
        """Where a cluster client starts."""
        return self.nodes[0].url

    def start(self) -> Self:
        """Start the servers, join them into one cluster, and wait until every node says
        ``cluster_state:ok``; returns ``self``.

        Raises:
            RedisServerUnavailable: a server did not start, ``redis-cli`` is missing or the
                cluster did not form.
        """
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RedisServerUnavailable("redis-cli was not found on PATH (it comes with "
                                         "redis-server: apt-get install -y redis-server)")
        try:
            for node in self.nodes:
                node.start()
            addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
            created = subprocess.run(
                [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0",
                 "--cluster-yes"],
                capture_output=True, timeout=60, check=False, stdin=subprocess.DEVNULL)
            if created.returncode != 0:
                tail = created.stdout.decode(errors="replace").strip().splitlines()[-3:]
                raise RedisServerUnavailable("redis-cli --cluster create failed: "
                                             + " | ".join(tail))
            deadline = time.monotonic() + START_TIMEOUT_S * 3
            while not all(_cluster_ok(cli, node.port) for node in self.nodes):
                if time.monotonic() > deadline:
                    raise RedisServerUnavailable("the cluster never reached cluster_state:ok")
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node; idempotent."""
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _cluster_ok(cli: str, port: int) -> bool:
    info = subprocess.run([cli, "-p", str(port), "cluster", "info"], capture_output=True,
                          timeout=10, check=False, stdin=subprocess.DEVNULL)
    return b"cluster_state:ok" in info.stdout


class RedisSentinel:
    """One Sentinel (``redis-server <conf> --sentinel``) on a free loopback port, monitoring
    the primary at ``primary_port`` as ``service`` with a quorum of 1 (so it alone may fail
    over), told of the replicas on ``replicas`` from the start; use as a context manager,
    or call :meth:`start` and :meth:`stop`.

    Attributes:
        port: the Sentinel's port (0 until started).
        url: ``redis://127.0.0.1:<port>/0`` (the store's ``sentinel`` mode URL).
    """

    def __init__(self, primary_port: int, service: str = "compact-proxy", *,
                 replicas: tuple[int, ...] = ()) -> None:
        self.primary_port = primary_port
        self.replicas = replicas
        self.service = service
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None

    @property
    def url(self) -> str:
        """The URL naming this Sentinel."""
        return f"redis://127.0.0.1:{self.port}/0"

    def primary(self) -> tuple[str, int] | None:
        """The primary's address as the Sentinel names it now (``None``: it names none)."""
        cli = shutil.which("redis-cli")
        assert cli is not None
        reply = subprocess.run(
            [cli, "-p", str(self.port), "sentinel", "get-master-addr-by-name", self.service],
            capture_output=True, timeout=10, check=False, stdin=subprocess.DEVNULL)
        lines = reply.stdout.decode(errors="replace").split()
        if reply.returncode != 0 or len(lines) != 2 or not lines[1].isdigit():
            return None
        return lines[0], int(lines[1])

    def command(self, *args: str) -> str:
        """A Sentinel command through ``redis-cli``; its output."""
        cli = shutil.which("redis-cli")
        assert cli is not None
        reply = subprocess.run([cli, "-p", str(self.port), *args], capture_output=True,
                               timeout=10, check=False, stdin=subprocess.DEVNULL)
        return reply.stdout.decode(errors="replace")

    def start(self) -> Self:
        """Start the Sentinel; ready once it names the primary. Returns ``self``.

        Raises:
            RedisServerUnavailable: not installed, or it never named the primary.
        """
        executable = find_redis_server()
        if shutil.which("redis-cli") is None:
            raise RedisServerUnavailable("redis-cli was not found on PATH")
        self._dir = Path(tempfile.mkdtemp(prefix="compact-proxy-sentinel-"))
        self.port = free_port()
        conf = self._dir / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self._dir}\n"
            f"sentinel monitor {self.service} 127.0.0.1 {self.primary_port} 1\n"
            f"sentinel down-after-milliseconds {self.service} 1000\n"
            f"sentinel failover-timeout {self.service} 10000\n"
            # Known at once, not after the primary's next INFO (10 s).
            + "".join(f"sentinel known-replica {self.service} 127.0.0.1 {port}\n"
                      for port in self.replicas), encoding="utf-8")
        with (self._dir / "sentinel.log").open("ab") as log:
            self._proc = subprocess.Popen([executable, str(conf), "--sentinel"],
                                          stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            if _answers_ping(self.port) and self.primary() is not None:
                return self
            time.sleep(0.05)
        log_text = (self._dir / "sentinel.log").read_text(encoding="utf-8", errors="replace")
        self.stop()
        raise RedisServerUnavailable("redis sentinel did not start: "
                                     + " | ".join(log_text.strip().splitlines()[-5:]))

    def stop(self) -> None:
        """Stop the Sentinel and remove its directory; idempotent."""
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
