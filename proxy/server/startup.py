"""The lines ``compact-proxy serve`` prints on stdout once it listens, for the person at the
terminal (the log has the same facts): where, in front of what, the thresholds per role, and
the line that points Claude Code at it. Printed once (by the supervisor with several workers).
"""

from __future__ import annotations

from typing import TextIO

from policies._roles import ROLE_NAMES
from proxy.config import Config
from proxy.telemetry.masking import mask_url

__all__ = ["print_banner"]

#: Hosts that mean "every address": a client reaches the proxy on loopback there.
_ANY_HOST = frozenset({"0.0.0.0", "::", ""})


def print_banner(config: Config, port: int, stream: TextIO) -> None:
    """Write the banner to ``stream`` (listen URL and upstream, thresholds per role, the
    ``export`` line) and flush."""
    host = config.listen.host
    shown = f"[{host}]" if ":" in host else host
    client_host = "127.0.0.1" if host in _ANY_HOST else shown
    roles = config.role_policies()
    thresholds = "; ".join(
        f"{role} soft {policy.soft_threshold_tokens:,} / hard {policy.hard_limit_tokens:,}"
        for role in ROLE_NAMES for policy in (roles.policy_for(role),))
    lines = [
        f"compact-proxy listening on http://{shown}:{port}, upstream "
        f"{mask_url(str(config.upstream.base_url))}",
        f"thresholds (tokens of the whole prompt: system + tools + messages): {thresholds}",
        "point Claude Code at it:",
        f"  export ANTHROPIC_BASE_URL=http://{client_host}:{port}",
    ]
    stream.write("".join(f"{line}\n" for line in lines))
    stream.flush()
