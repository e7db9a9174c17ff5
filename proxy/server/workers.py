"""``compact-proxy serve --workers N``: N processes serving one port, and the supervisor
(docs/operations.md, "Several processes").

The supervisor serves nothing: it binds the port once (``SO_REUSEPORT``, kept bound so nobody
takes it during a restart), opens the store, imports the app, then forks N workers that each
run :func:`proxy.server.app.serve`. A pipe per worker says it started and, by its end-of-file,
that it died; a second pipe tells the worker its supervisor is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import selectors
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from types import FrameType
from typing import Any, Final

import structlog
from prometheus_client import values as prometheus_values

from proxy.config import Config, ConfigError
from proxy.server.event_loop import loop_factory
from proxy.server.event_loop import run as run_loop
from proxy.server.startup import print_banner
from proxy.telemetry.logs import configure_logging
from proxy.telemetry.masking import config_secrets
from proxy.telemetry.metrics import MULTIPROCESS_ENV

__all__ = ["BACKOFF_FIRST_S", "BACKOFF_MAX_S", "BACKOFF_RESET_S", "STOP_MARGIN_S", "backoff_s",
           "supervise"]

_log = structlog.get_logger("proxy.server.workers")

#: The first restart of a worker waits this long (seconds); each death in a row doubles it.
BACKOFF_FIRST_S: Final = 0.25
#: The longest wait before a restart (seconds).
BACKOFF_MAX_S: Final = 10.0
#: A worker that ran this long (seconds) before dying restarts after the first backoff again.
BACKOFF_RESET_S: Final = 10.0
#: Seconds a worker may take to stop beyond ``listen.drain_timeout_s`` (its cleanup: the
#: bookkeeping still running, the ledger's last write) before it is killed.
STOP_MARGIN_S: Final = 15.0
#: What a worker writes on its pipe once it accepts connections.
_READY: Final = b"ready\n"
#: Exit codes (as ``compact-proxy``'s).
_EXIT_OK: Final = 0
_EXIT_FAILED: Final = 1
_EXIT_CONFIG: Final = 2


def backoff_s(deaths_in_a_row: int) -> float:
    """Seconds to wait before starting a worker again after its ``deaths_in_a_row``-th quick
    death (1 for the first)."""
    return min(BACKOFF_FIRST_S * 2.0 ** max(deaths_in_a_row - 1, 0), BACKOFF_MAX_S)


# -- the supervisor ----------------------------------------------------------------------------


def _reserve(host: str, port: int, section: str = "listen") -> tuple[list[socket.socket], int]:
    """Bind (without listening) every address of ``host`` with ``SO_REUSEPORT``; returns the
    sockets and the port (the kernel's pick for 0). ``ConfigError`` names ``section``'s keys."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise ConfigError("listen.workers", "more than 1 needs SO_REUSEPORT, which this "
                                            "platform does not have; use 1")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"{section}.host", f"cannot resolve {host!r}: {exc.strerror}"
                          ) from None
    sockets: list[socket.socket] = []
    chosen = port
    try:
        for family, kind, proto, _, address in dict.fromkeys(
                (family, kind, proto, "", address) for family, kind, proto, _, address in infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((address[0], chosen, *address[2:]))
            chosen = sock.getsockname()[1]
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise ConfigError(f"{section}.port",
                          f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sockets, chosen


def check_store(config: Config) -> None:
    """Open the store once and close it (creating the SQLite file, in WAL mode);
    ``ConfigError`` when it cannot be opened."""
    from proxy.store import StoreError, store_for

    async def open_and_close() -> None:
        store = store_for(config)
        try:
            await store.open()
        finally:
            await store.close()

    try:
        asyncio.run(open_and_close())
    except StoreError as exc:
        key = "store.url" if config.store.backend == "redis" else "store.path"
        raise ConfigError(key, f"cannot open the state store: {exc}") from None


@dataclasses.dataclass
class _Worker:
    """One slot of the supervisor: the process now in it, and its history."""

    index: int
    pid: int | None = None
    ready_pipe: int | None = None  # read end: "ready", then end-of-file when it dies
    lifeline: int | None = None  # write end of its stdin-like pipe: closed when we go
    started_at: float = 0.0
    ready: bool = False
    deaths_in_a_row: int = 0
    restart_at: float | None = None


class _Supervisor:
    def __init__(self, config: Config, port: int, metrics_dir: str,
                 inherited: list[int]) -> None:
        self.config = dataclasses.replace(config, listen=dataclasses.replace(
            config.listen, port=port))
        self.metrics_dir = metrics_dir
        self.inherited = inherited  # descriptors of ours a worker closes at once
        self.workers = [_Worker(index) for index in range(config.listen.workers)]
        self.selector = selectors.DefaultSelector()
        self.all_started = False
        self.stopping = False
        self.stop_deadline = 0.0
        self.code = _EXIT_OK
        self.signals: list[int] = []

    # -- workers ---------------------------------------------------------------------------

    def start(self, worker: _Worker) -> None:
        ready_read, ready_write = os.pipe()
        life_read, life_write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker: never returns into the supervisor's code
            code = _EXIT_FAILED
            try:
                theirs = [ready_read, life_write, *self.inherited, self.selector.fileno()]
                theirs += [fd for w in self.workers for fd in (w.ready_pipe, w.lifeline)
                           if fd is not None]
                code = _run_worker(self.config, worker.index, ready_write, life_read,
                                   self.metrics_dir, theirs)
            except BaseException as exc:  # noqa: BLE001 - reported, then the process ends
                print(f"worker {worker.index}: {type(exc).__name__}", file=sys.stderr)
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        os.close(ready_write)
        os.close(life_read)
        worker.pid, worker.ready_pipe, worker.lifeline = pid, ready_read, life_write
        worker.started_at, worker.ready, worker.restart_at = time.monotonic(), False, None
        self.selector.register(ready_read, selectors.EVENT_READ, worker)
        _log.info("worker_started", worker=worker.index, worker_pid=pid)

    def on_pipe(self, worker: _Worker) -> None:
        assert worker.ready_pipe is not None and worker.pid is not None
        try:
            data = os.read(worker.ready_pipe, 64)
        except OSError:
            data = b""
        if data:
            if _READY in data and not worker.ready:
                worker.ready = True
                self.on_ready()
            return
        self.selector.unregister(worker.ready_pipe)
        os.close(worker.ready_pipe)
        worker.ready_pipe = None
        _, status = os.waitpid(worker.pid, 0)
        self.on_exit(worker, os.waitstatus_to_exitcode(status))

    def on_ready(self) -> None:
        if not self.all_started and all(w.ready for w in self.workers):
            self.all_started = True
            admin = self.config.admin.listen
            _log.info("workers_started", workers=len(self.workers), host=self.config.listen.host,
                      port=self.config.listen.port, store_backend=self.config.store.backend,
                      drain_timeout_s=self.config.listen.drain_timeout_s,
                      admin_port=None if admin is None else admin.port)

    def on_exit(self, worker: _Worker, returncode: int) -> None:
        pid, worker.pid = worker.pid, None
        if worker.lifeline is not None:
            os.close(worker.lifeline)
            worker.lifeline = None
        uptime = round(time.monotonic() - worker.started_at, 3)
        code = returncode if returncode >= 0 else None
        signame = signal.Signals(-returncode).name if returncode < 0 else None
        fields: dict[str, Any] = {"worker": worker.index, "worker_pid": pid,
                                  "exit_code": code, "signal": signame, "uptime_s": uptime}
        if self.stopping:
            _log.info("worker_stopped", **fields)
            return
        if not self.all_started:
            _log.error("worker_failed_to_start", **fields)
            self.code = _EXIT_CONFIG if returncode == _EXIT_CONFIG else _EXIT_FAILED
            self.stop()
            return
        worker.deaths_in_a_row = 1 if uptime >= BACKOFF_RESET_S else worker.deaths_in_a_row + 1
        delay = backoff_s(worker.deaths_in_a_row)
        worker.restart_at = time.monotonic() + delay
        _log.warning("worker_exited", restart_in_s=delay, **fields)

    def live(self) -> list[_Worker]:
        return [w for w in self.workers if w.pid is not None]

    # -- stopping ---------------------------------------------------------------------------

    def stop(self, signum: int | None = None) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.stop_deadline = (time.monotonic() + self.config.listen.drain_timeout_s
                              + STOP_MARGIN_S)
        _log.info("workers_stopping", signal=None if signum is None else signal.Signals(
            signum).name, workers=len(self.live()))
        for worker in self.live():
            assert worker.pid is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGTERM)

    def kill_stragglers(self) -> None:
        for worker in self.live():
            assert worker.pid is not None
            _log.error("worker_killed", worker=worker.index, worker_pid=worker.pid,
                       drain_timeout_s=self.config.listen.drain_timeout_s)
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)
        self.code = _EXIT_FAILED

    # -- the loop ---------------------------------------------------------------------------

    def run(self, wakeup: int) -> int:
        self.selector.register(wakeup, selectors.EVENT_READ, None)
        for worker in self.workers:
            self.start(worker)
        while self.live() or not self.stopping:
            now = time.monotonic()
            if self.stopping:
                if now >= self.stop_deadline:
                    self.kill_stragglers()
                    self.stop_deadline = now + STOP_MARGIN_S
            else:
                for worker in self.workers:
                    if worker.restart_at is not None and worker.restart_at <= now:
                        self.start(worker)
            due = ([self.stop_deadline] if self.stopping
                   else [w.restart_at for w in self.workers if w.restart_at is not None])
            timeout = max(0.0, min(due) - time.monotonic()) if due else None
            for key, _ in self.selector.select(timeout):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wakeup, 512)
                    while self.signals:
                        self.stop(self.signals.pop(0))
                else:
                    self.on_pipe(key.data)
        self.selector.close()
        return self.code

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)


def _no_other_threads() -> None:
    """Wait (briefly) for threads other than this one to end: a fork copies only the
    calling thread, and a lock another thread held would stay locked in the worker."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread():
            thread.join(timeout=5.0)
    left = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    if left:
        _log.warning("threads_before_fork", detail=",".join(left))


def supervise(config: Config) -> int:
    """Run ``config.listen.workers`` worker processes on one port until SIGTERM / SIGINT;
    returns the exit code (0 once every worker drained and exited). ``ConfigError``: the
    address cannot be bound or the store opened; nothing runs."""
    configure_logging(config.logging, secrets=config_secrets(config),
                      fields={"pid": os.getpid()})
    sockets, port = _reserve(config.listen.host, config.listen.port)
    metrics_dir: str | None = None
    read_end, write_end = os.pipe()
    previous: dict[int, Any] = {}
    old_wakeup = -1
    try:
        admin = config.admin.listen
        if admin is not None:  # reserved as the main port is: every worker binds that port
            admin_sockets, admin_port = _reserve(admin.host, admin.port, "admin.listen")
            sockets += admin_sockets
            config = dataclasses.replace(config, admin=dataclasses.replace(
                config.admin, listen=dataclasses.replace(admin, port=admin_port)))
        check_store(config)
        # The app's modules and the event loop's, once, here: every worker forked from this
        # process has them (and a loop that cannot be loaded stops serve before any fork).
        import proxy.server.app  # noqa: F401

        loop_factory(config.listen.event_loop)

        _no_other_threads()
        metrics_dir = tempfile.mkdtemp(prefix="compact-proxy-metrics-")
        inherited = [read_end, write_end, *(sock.fileno() for sock in sockets)]
        supervisor = _Supervisor(config, port, metrics_dir, inherited)
        print_banner(config, port, sys.stdout)
        for fd in (read_end, write_end):
            os.set_blocking(fd, False)
        old_wakeup = signal.set_wakeup_fd(write_end)
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, supervisor.on_signal)
        code = supervisor.run(read_end)
        _log.info("workers_stopped", exit_code=code)
        return code
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if previous:
            signal.set_wakeup_fd(old_wakeup)
        os.close(read_end)
        os.close(write_end)
        for sock in sockets:
            sock.close()
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


# -- a worker -----------------------------------------------------------------------------------


def _run_worker(config: Config, index: int, ready: int, lifeline: int, metrics_dir: str,
                theirs: list[int]) -> int:
    """The body of a forked worker; returns its exit code."""
    # The supervisor's signal handling and descriptors are not the worker's.
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd in theirs:
        with contextlib.suppress(OSError):
            os.close(fd)
    # prometheus_client picks where values live when a metric is made, from this variable:
    # in files of this worker's pid in the shared directory, summed by /metrics.
    os.environ[MULTIPROCESS_ENV] = metrics_dir
    prometheus_values.ValueClass = prometheus_values.get_value_class()  # type: ignore[no-untyped-call]
    configure_logging(config.logging, secrets=config_secrets(config),
                      fields={"worker": index, "pid": os.getpid()}, final=True)
    try:
        return run_loop(_serve_worker(config, ready, lifeline), config.listen.event_loop)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return _EXIT_CONFIG
    except KeyboardInterrupt:
        return _EXIT_OK


async def _serve_worker(config: Config, ready: int, lifeline: int) -> int:
    from proxy.server.app import serve

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_lifeline() -> None:
        try:
            data = os.read(lifeline, 64)
        except OSError:
            data = b""
        if not data:  # the supervisor is gone: stop as on SIGTERM
            loop.remove_reader(lifeline)
            _log.warning("supervisor_gone")
            stop.set()

    def started() -> None:
        os.write(ready, _READY)

    loop.add_reader(lifeline, on_lifeline)
    return await serve(config, reuse_port=True, stop=stop, started=started)
