"""AWS Signature Version 4 for the requests the proxy sends to Bedrock: botocore's algorithm
for the one shape the proxy signs (method, path canonicalised as botocore does, query,
``host``, ``x-amz-date`` and ``x-amz-security-token``, over the exact body), without
``SigV4Auth``'s request object (bench/README.md). The fake provider checks each with botocore.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import quote

from botocore.utils import normalize_url_path
from yarl import URL

__all__ = ["SigV4"]

_ALGORITHM: Final = "AWS4-HMAC-SHA256"
_SERVICE: Final = "bedrock"


class SigV4:
    """Signs for one region (service ``bedrock``); the day's signing key is kept."""

    def __init__(self, region: str) -> None:
        self.region = region
        self._key: tuple[str, str, bytes] | None = None  # (secret, day, key)

    def _signing_key(self, secret: str, day: str) -> bytes:
        kept = self._key
        if kept is not None and kept[0] == secret and kept[1] == day:
            return kept[2]
        key = f"AWS4{secret}".encode()
        for part in (day, self.region, _SERVICE, "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        self._key = (secret, day, key)
        return key

    def headers(self, method: str, url: URL, body: bytes, credentials: Any,
                now: datetime | None = None) -> dict[str, str]:
        """The headers that sign ``body`` sent to ``url`` (``Authorization``,
        ``X-Amz-Date``, and ``X-Amz-Security-Token`` for temporary credentials)."""
        amz_date = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
        day = amz_date[:8]
        signed_headers = {"host": url.host_port_subcomponent or "", "x-amz-date": amz_date}
        token = credentials.token
        if token:
            signed_headers["x-amz-security-token"] = token
        signed = ";".join(signed_headers)
        query = url.raw_query_string
        pairs = sorted(pair.partition("=")[::2] for pair in query.split("&")) if query else []
        canonical = "\n".join((
            method.upper(),
            quote(normalize_url_path(url.raw_path), safe="/~"),
            "&".join(f"{key}={value}" for key, value in pairs),
            "".join(f"{name}:{value.strip()}\n" for name, value in signed_headers.items()),
            signed,
            hashlib.sha256(body).hexdigest(),
        ))
        scope = f"{day}/{self.region}/{_SERVICE}/aws4_request"
        to_sign = f"{_ALGORITHM}\n{amz_date}\n{scope}\n" + hashlib.sha256(
            canonical.encode()).hexdigest()
        signature = hmac.new(self._signing_key(credentials.secret_key, day), to_sign.encode(),
                             hashlib.sha256).hexdigest()
        out = {"X-Amz-Date": amz_date, "Authorization": (
            f"{_ALGORITHM} Credential={credentials.access_key}/{scope}, "
            f"SignedHeaders={signed}, Signature={signature}")}
        if token:
            out["X-Amz-Security-Token"] = token
        return out
