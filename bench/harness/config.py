"""The benchmarks' settings, in one place.

The model and key every request carries, timeouts, the work sizes (``FULL`` / ``QUICK`` /
``TINY``), the compaction thresholds, and the config files written for a benchmark proxy
(:func:`write_proxy_config`) and for LiteLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import yaml

#: The repository root (the source tree a benchmark proxy runs from by default).
ROOT: Final = Path(__file__).resolve().parents[2]

MODEL: Final = "claude-sonnet-4-5"
BENCH_API_KEY: Final = "sk-ant-bench-0000000000000000"
SESSION_HEADER: Final = "x-compact-session-id"
# An environment variable that is never set: the admin API stays off.
ADMIN_TOKEN_ENV: Final = "COMPACT_PROXY_BENCH_ADMIN_TOKEN_UNSET"
STARTUP_TIMEOUT_S: Final = 60.0
REQUEST_TIMEOUT_S: Final = 120.0
STOP_TIMEOUT_S: Final = 5.0
SESSION_SEED: Final = 20_260_504


class BenchError(RuntimeError):
    """The benchmark could not run (a process did not start, a request failed hard)."""


# -- sizes and thresholds ---------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """How much work each part does.

    Attributes:
        latency_requests: timed requests per latency cell, per target (proxy and direct).
        throughput_requests: requests per target in the throughput part.
        concurrency: concurrent client workers in the throughput part.
        streams: concurrent streams in the memory / relay part.
        stream_event_delay_ms: the provider's pause between two events of those streams.
        stream_ramp_s: the streams are opened over this many seconds (not in one SYN burst).
        session_turns: turns of the simulated agent session.
        small_bytes: size of the request under the threshold.
        large_bytes: size of the history above the threshold.
        huge_bytes: the largest warm history (the flatness of the warm path).
        cold_bytes: the history whose first request is timed (compacted from scratch).
        cold_requests: timed first requests per target (each a new session).
    """

    latency_requests: int
    throughput_requests: int
    concurrency: int
    streams: int
    stream_event_delay_ms: float
    stream_ramp_s: float
    session_turns: int
    small_bytes: int
    large_bytes: int
    huge_bytes: int
    cold_bytes: int
    cold_requests: int


@dataclass(frozen=True)
class Thresholds:
    """The ``compaction`` section every proxy of the run gets (besides ``sticky``)."""

    soft_threshold_tokens: int
    hard_limit_tokens: int
    max_tool_result_tokens: int
    keep_recent_messages: int
    summary_keep_recent: int

    def as_config(self) -> dict[str, int]:
        """The config keys and values."""
        return {
            "soft_threshold_tokens": self.soft_threshold_tokens,
            "hard_limit_tokens": self.hard_limit_tokens,
            "max_tool_result_tokens": self.max_tool_result_tokens,
            "keep_recent_messages": self.keep_recent_messages,
            "summary_keep_recent": self.summary_keep_recent,
        }


FULL: Final = Sizes(latency_requests=300, throughput_requests=1200, concurrency=16, streams=200,
                    stream_event_delay_ms=250.0, stream_ramp_s=1.0, session_turns=300,
                    small_bytes=50_000, large_bytes=800_000, huge_bytes=2_600_000,
                    cold_bytes=1_000_000, cold_requests=20)
QUICK: Final = replace(FULL, latency_requests=40, throughput_requests=320, session_turns=120,
                       cold_requests=12)
#: For the smoke test: a few requests of each kind, seconds in all.
TINY: Final = Sizes(latency_requests=3, throughput_requests=12, concurrency=4, streams=6,
                    stream_event_delay_ms=20.0, stream_ramp_s=0.05, session_turns=30,
                    small_bytes=20_000, large_bytes=60_000, huge_bytes=90_000,
                    cold_bytes=60_000, cold_requests=2)

#: Soft 40k / hard 100k / tool results 2k, as the issue suggests. L3 keeps the last 60
#: messages (~30 turns), which is more than a crossing may keep, so a crossing needs L4: the
#: session then exercises every layer, and the number of summary calls means something.
SESSION_THRESHOLDS: Final = Thresholds(soft_threshold_tokens=40_000, hard_limit_tokens=100_000,
                                       max_tool_result_tokens=2_000, keep_recent_messages=60,
                                       summary_keep_recent=8)
#: For the smoke test; the soft threshold sits above system + tools (~3.8k tokens), so a
#: compacted view can get below it.
TINY_THRESHOLDS: Final = Thresholds(soft_threshold_tokens=8_000, hard_limit_tokens=60_000,
                                    max_tool_result_tokens=600, keep_recent_messages=40,
                                    summary_keep_recent=4)


# -- the workload: a coding agent's session -----------------------------------------------------


def write_proxy_config(directory: Path, upstream_url: str, thresholds: Thresholds, *,
                       sticky: bool, port: int, audit: bool = True,
                       overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Path:
    """A ``serve`` config for one benchmark proxy, everything under ``directory``;
    ``overrides``: keys of its sections set to other values (``{"audit": {"enabled":
    False}}``)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "transcripts").mkdir(exist_ok=True)
    (directory / "artifacts").mkdir(exist_ok=True)
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "upstream": {"base_url": upstream_url, "connect_timeout_s": 5, "read_timeout_s": 60},
        "compaction": {**thresholds.as_config(), "token_counter": "tiktoken", "sticky": sticky},
        "summary": {"enabled": True, "max_retries": 0, "timeout_s": 30},
        "store": {"backend": "sqlite", "path": str(directory / "state.db")},
        "sources": {"transcript_root": str(directory / "transcripts"),
                    "artifact_root": str(directory / "artifacts")},
        "admin": {"token_env": ADMIN_TOKEN_ENV},
        "audit": {"enabled": audit},
        "logging": {"format": "json", "level": "info"},
    }
    for section, values in (overrides or {}).items():
        config[section] = {**config.get(section, {}), **values}
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path



LITELLM_ENV: Final = "LITELLM_BIN"
LITELLM_VENV: Final = Path("/work/.bench-venvs/litellm")
LITELLM_INSTALL: Final = ("python3 -m venv /work/.bench-venvs/litellm && "
                          "/work/.bench-venvs/litellm/bin/pip install 'litellm[proxy]'")
LITELLM_STARTUP_TIMEOUT_S: Final = 120.0


def write_litellm_config(directory: Path, upstream_url: str) -> Path:
    """LiteLLM's proxy config: the benchmark's model on the ``anthropic`` provider with the
    fake provider as ``api_base``, so its Anthropic-native ``/v1/messages`` endpoint sends the
    Messages API on to ``{api_base}/v1/messages``; the master key is the benchmark's API key
    (which the client sends as ``x-api-key``)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "model_list": [{"model_name": MODEL, "litellm_params": {
            "model": f"anthropic/{MODEL}", "api_base": upstream_url, "api_key": BENCH_API_KEY}}],
        "general_settings": {"master_key": BENCH_API_KEY},
    }
    path = directory / "litellm.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path

