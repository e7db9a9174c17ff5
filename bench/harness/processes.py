"""Child processes of a benchmark.

:class:`ManagedProcess` (stopped on every way out, its output in a log file), free ports, the
fake provider, ``proxy.cli.commands serve``, LiteLLM, a baseline commit in a temporary ``git
worktree``.
"""

from __future__ import annotations

import asyncio
import atexit
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import aiohttp

from bench.harness.client import provider_ms_of
from bench.harness.config import (
    BENCH_API_KEY,
    LITELLM_ENV,
    LITELLM_INSTALL,
    LITELLM_STARTUP_TIMEOUT_S,
    LITELLM_VENV,
    MODEL,
    ROOT,
    STARTUP_TIMEOUT_S,
    STOP_TIMEOUT_S,
    BenchError,
    Thresholds,
    write_litellm_config,
    write_proxy_config,
)
from bench.harness.stats import children, process_cpu_ns
from bench.harness.workloads import history_of_size, request_body, request_headers
from bench.stamped_upstream import PROVIDER_MS_FIELD, PROVIDER_MS_HEADER


class ManagedProcess:
    """One child process of the benchmark; its output goes to a log file.

    Every started process is registered until stopped; :meth:`stop_all` (also run at
    interpreter exit) stops whatever is left.
    """

    _live: ClassVar[set[ManagedProcess]] = set()
    #: Every process started in this interpreter, for the machine meter (:class:`MachineMeter`).
    started: ClassVar[list[ManagedProcess]] = []

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, *,
                 source: Path | None = ROOT, cwd: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        """``source``: the source tree put first on ``PYTHONPATH`` (None: none); ``cwd``:
        where it runs (default: ``source``, else the repository root); ``env``: added."""
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.source = source
        self.cwd = cwd or source or ROOT
        self.extra_env = dict(env or {})
        self._proc: subprocess.Popen[bytes] | None = None
        self.final_cpu_ns = math.nan  # read just before it was stopped

    def start(self) -> None:
        """Start the process."""
        env = {k: v for k, v in os.environ.items() if k not in ("COMPACT_PROXY_CONFIG",)}
        if self.source is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.source),
                                                              env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        with self.log_path.open("ab") as log:
            # Own session: a Ctrl-C in the terminal reaches the benchmark only, which then
            # stops its children in order.
            self._proc = subprocess.Popen(self.argv, cwd=self.cwd, env=env,
                                          stdin=subprocess.DEVNULL,
                                          stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        ManagedProcess._live.add(self)
        ManagedProcess.started.append(self)

    def cpu_ns(self) -> float:
        """CPU nanoseconds so far (while running), else as last read before the stop."""
        if self._proc is not None and self._proc.poll() is None:
            return process_cpu_ns(self._proc.pid)
        return self.final_cpu_ns

    @property
    def pid(self) -> int:
        """The process id."""
        if self._proc is None:
            raise BenchError(f"{self.name} was not started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit code, once it has exited."""
        return None if self._proc is None else self._proc.poll()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S`; idempotent."""
        proc = self._proc
        ManagedProcess._live.discard(self)
        if proc is None or proc.poll() is not None:
            return
        self.final_cpu_ns = process_cpu_ns(proc.pid)
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of the process's output."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    @classmethod
    def stop_all(cls) -> None:
        """Stop every process still running."""
        for process in list(cls._live):
            process.stop()

    @classmethod
    def live(cls) -> list[ManagedProcess]:
        """The processes started and not yet stopped."""
        return list(cls._live)


atexit.register(ManagedProcess.stop_all)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class Service:
    """A started server: its base URL and, for a child process, the process."""

    url: str
    process: ManagedProcess | None = None


async def wait_until_up(client: aiohttp.ClientSession, process: ManagedProcess, url: str,
                         headers: dict[str, str] | None = None, *,
                         timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process.running:
            raise BenchError(f"{process.name} exited with code {process.returncode} before it "
                             f"answered:\n{process.log_tail()}")
        try:
            async with client.get(url, headers=headers,
                                  timeout=aiohttp.ClientTimeout(total=2)) as response:
                if response.status == 200:
                    return
        except (TimeoutError, aiohttp.ClientError):
            pass
        await asyncio.sleep(0.05)
    raise BenchError(f"{process.name} did not answer {url} within {timeout_s:g}s:\n"
                     f"{process.log_tail()}")


@asynccontextmanager
async def upstream_process(client: aiohttp.ClientSession, workdir: Path) -> AsyncIterator[Service]:
    """The stamped fake provider as a child process on a free port."""
    port = free_port()
    process = ManagedProcess("fake-upstream", [sys.executable, "-m", "bench.stamped_upstream",
                                               "--port", str(port)], workdir / "upstream.log")
    process.start()
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_until_up(client, process, f"{url}/v1/models", {"x-api-key": BENCH_API_KEY})
        yield Service(url, process)
    finally:
        process.stop()



@asynccontextmanager
async def proxy_process(client: aiohttp.ClientSession, workdir: Path, name: str,
                        upstream_url: str, thresholds: Thresholds, *,
                        sticky: bool, audit: bool = True, source: Path = ROOT,
                        overrides: Mapping[str, Mapping[str, Any]] | None = None,
                        ) -> AsyncIterator[Service]:
    """``python -m proxy.cli serve`` as a child process on a free port, waited for /healthz
    (``source``: the source tree it runs from, e.g. a baseline's worktree; ``overrides``: see
    :func:`write_proxy_config`)."""
    port = free_port()
    config = write_proxy_config(workdir / name, upstream_url, thresholds, sticky=sticky, port=port,
                                audit=audit, overrides=overrides)
    process = ManagedProcess(name, [sys.executable, "-m", "proxy.cli", "serve", "--config",
                                    str(config)], workdir / f"{name}.log", source=source)
    process.start()
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_until_up(client, process, f"{url}/healthz")
        yield Service(url, process)
    finally:
        process.stop()



def find_litellm() -> Path | None:
    """LiteLLM's ``litellm`` command: ``$LITELLM_BIN``, else the side virtualenv
    ``/work/.bench-venvs/litellm`` or ``../.bench-venvs/litellm`` next to the repository."""
    named = os.environ.get(LITELLM_ENV)
    candidates = [Path(named)] if named else [
        LITELLM_VENV / "bin" / "litellm",
        ROOT.parent / ".bench-venvs" / "litellm" / "bin" / "litellm"]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None



@dataclass(frozen=True)
class ExtraHop:
    """An optional hop of the run (LiteLLM, a baseline proxy): started, or why not."""

    service: Service | None
    note: str


@asynccontextmanager
async def litellm_process(client: aiohttp.ClientSession, workdir: Path,
                          upstream_url: str) -> AsyncIterator[ExtraHop]:
    """LiteLLM's proxy (when installed) on a free port, pointed at the fake provider, and
    checked once: a JSON and a streamed request must come back 200 with the provider's time.
    Never fails the run: what went wrong is the hop's note."""
    binary = find_litellm()
    if binary is None:
        yield ExtraHop(None, f"LiteLLM: not installed (install it in a side virtualenv: "
                             f"{LITELLM_INSTALL}; or set ${LITELLM_ENV})")
        return
    port = free_port()
    config = write_litellm_config(workdir / "litellm", upstream_url)
    # No network here: LiteLLM reads its model cost map from its package, not GitHub.
    process = ManagedProcess("litellm", [str(binary), "--config", str(config), "--host",
                                         "127.0.0.1", "--port", str(port)],
                             workdir / "litellm.log", source=None, cwd=workdir / "litellm",
                             env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    process.start()
    try:
        url = f"http://127.0.0.1:{port}"
        note = ""
        usable = False
        version = "?"
        try:
            await wait_until_up(client, process, f"{url}/health/liveliness",
                                 timeout_s=LITELLM_STARTUP_TIMEOUT_S)
            probe = request_body(history_of_size(20_000), stream=False)
            usable = True
            for stream in (False, True):
                body = probe if not stream else probe.replace(b'"stream":false', b'"stream":true')
                headers = request_headers("bench-litellm-probe")
                async with client.post(f"{url}/v1/messages", data=body,
                                       headers=headers) as response:
                    text = await response.read()
                    version = response.headers.get("x-litellm-version", version)
                    if response.status != 200:
                        usable = False
                        note = (f"LiteLLM {version} ({binary}) could not forward to the fake "
                                f"provider: {'stream' if stream else 'json'} probe got HTTP "
                                f"{response.status}: {text[:300].decode(errors='replace')}")
                        break
                    if provider_ms_of(response.headers, text) is None:
                        note = (f"LiteLLM {version}: the answer lost the provider's time "
                                f"(no {PROVIDER_MS_HEADER} header, no {PROVIDER_MS_FIELD} field)"
                                "; own time is not measurable through it")
        except (BenchError, TimeoutError, aiohttp.ClientError) as exc:
            usable = False
            note = f"LiteLLM ({binary}) did not start or answer: {exc}"
        if not usable:
            process.stop()
            yield ExtraHop(None, note)
        else:
            yield ExtraHop(Service(url, process),
                           note or f"LiteLLM {version} ({binary}): /v1/messages, model "
                                   f"anthropic/{MODEL}, api_base = the fake provider")
    finally:
        process.stop()


@contextmanager
def baseline_worktree(ref: str, directory: Path) -> Iterator[Path]:
    """A ``git worktree`` of ``ref`` in ``directory`` (detached), removed on the way out."""
    def git(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              timeout=120, check=check)

    try:
        git("worktree", "add", "--detach", str(directory), ref)
    except subprocess.CalledProcessError as exc:
        raise BenchError(f"--baseline {ref}: git worktree add failed: {exc.stderr.strip()}"
                         ) from exc
    try:
        yield directory
    finally:
        git("worktree", "remove", "--force", str(directory), check=False)
        shutil.rmtree(directory, ignore_errors=True)
        git("worktree", "prune", check=False)


def code_state() -> str:
    """Which compact-proxy this run measures: the working tree's commit, and the files of
    ``proxy/`` and ``compactor/`` that differ from it (work in progress is measured as is)."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              timeout=30, check=False)
        return done.stdout.rstrip()

    head = git("log", "-1", "--format=%h")
    last = git("log", "-1", "--format=%h %s", "--", "proxy", "compactor")[:80]
    changed = [line[3:] for line in git("status", "--porcelain", "--", "proxy",
                                        "compactor").splitlines() if line[3:]]
    dirty = f" + uncommitted changes in {', '.join(changed)}" if changed else ""
    return (f"compact-proxy: the working tree at {head or '?'} (proxy/ and compactor/ last "
            f"committed in {last or '?'}){dirty}")


def describe_ref(ref: str) -> str:
    """``ref`` as ``<short hash> <subject>`` (the ref itself when git cannot say)."""
    done = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h %s", ref],
                          capture_output=True, text=True, timeout=30, check=False)
    return done.stdout.strip()[:90] or ref



async def wait_for_workers(process: ManagedProcess, workers: int, name: str) -> None:
    """Until ``process`` (``serve`` with ``workers`` > 1, up) has all its workers: /healthz
    answers once the first one is up."""
    deadline = time.monotonic() + 30.0
    while workers > 1 and len(children(process.pid)) < workers:
        if time.monotonic() > deadline:
            raise BenchError(f"{name}: {workers} workers did not start:\n"
                             f"{process.log_tail()}")
        await asyncio.sleep(0.05)

