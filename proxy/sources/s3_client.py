"""The S3 client of the object-store source roots: one aiobotocore client per
:class:`S3ObjectStore`, created on first use, and what a failed request means as a resolution
outcome (:func:`store_error_outcome`).

Redirects are never followed (``denied``): aiohttp's ``allow_redirects`` is off, and a request
botocore's region redirector would re-send is refused before it is signed.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, Final

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.httpsession import AIOHTTPSession
from aiobotocore.session import AioSession, get_session
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    NoCredentialsError,
    PartialCredentialsError,
)

from compactor._source_files import Outcome as _Outcome
from proxy.sources.s3_roots import S3Settings

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

__all__ = ["CONCURRENCY", "STORE_ERRORS", "S3ObjectStore", "store_error_outcome"]

#: Seconds to open a connection to the store, and to wait for its next bytes.
CONNECT_TIMEOUT_S: Final = 5.0
READ_TIMEOUT_S: Final = 30.0
#: Attempts per call (the first included) on a connection error, a throttle or a 5xx.
MAX_ATTEMPTS: Final = 2
#: Pointers of one state resolved at once (each a HEAD, then a GET unless remembered); the
#: client's connection pool is this size too.
CONCURRENCY: Final = 8


_REDIRECT_CODES: Final = frozenset({"PermanentRedirect", "TemporaryRedirect", "Redirect"})
_MISSING_CODES: Final = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound"})


class RedirectRefused(Exception):
    """Internal: botocore was about to re-send a request elsewhere after a redirect."""


def _refuse_redirect_answer(response: Any = None, **_: Any) -> None:
    # Runs first among botocore's "needs-retry" handlers: a 3xx ends the call here, before
    # the S3 region redirector could re-send the request (or, for a 307 without a region,
    # probe the bucket with HeadBucket calls that are redirected in turn, without end).
    if response is not None and 300 <= response[0].status_code < 400:
        raise RedirectRefused("the object store answered with a redirect")


def _refuse_redirected(request: Any, **_: Any) -> None:
    # botocore's S3 region redirector marks the request it re-sends after a wrong-region
    # answer (a 400 naming another region); no such second request is signed or sent.
    context = getattr(request, "context", None) or {}
    if context.get("s3_redirected") or (context.get("s3_redirect") or {}).get("redirected"):
        raise RedirectRefused("the object store answered with a redirect")


class _RedirectsOff:
    """An ``aiohttp.ClientSession`` stand-in whose requests never follow ``Location``."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session

    def request(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["allow_redirects"] = False
        return self._session.request(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


class _NoRedirectHTTPSession(AIOHTTPSession):
    """aiobotocore's HTTP session with redirects off (aiohttp follows them by default)."""

    async def _get_session(self, proxy_url: Any) -> _RedirectsOff:
        return _RedirectsOff(await super()._get_session(proxy_url))  # type: ignore[misc]


class S3ObjectStore:
    """One S3 client, created on first use on the running loop (from ``session``, else a new
    aiobotocore session), closed by :meth:`close`."""

    def __init__(self, settings: S3Settings, *, session: AioSession | None = None) -> None:
        self._settings = settings
        self._session = session
        self._client: S3Client | None = None
        self._stack: AsyncExitStack | None = None
        self._lock = asyncio.Lock()

    async def client(self) -> S3Client:
        """The client (created on the first call)."""
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                self._client = await self._create()
        return self._client

    async def _create(self) -> S3Client:
        settings = self._settings
        config = AioConfig(
            connect_timeout=CONNECT_TIMEOUT_S,
            max_pool_connections=CONCURRENCY,
            read_timeout=READ_TIMEOUT_S,
            retries={"mode": "standard", "total_max_attempts": MAX_ATTEMPTS},
            # Path-style for a custom endpoint: every S3-compatible service serves it.
            s3={"addressing_style": "path" if settings.endpoint_url else "auto"},
            # Checksums only where an operation requires them: older S3-compatible services
            # refuse the newer defaults, and the resolver hashes what it reads itself.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            http_session_cls=_NoRedirectHTTPSession,
        )
        stack = AsyncExitStack()
        session = self._session if self._session is not None else get_session()
        client = await stack.enter_async_context(session.create_client(
            "s3", endpoint_url=settings.endpoint_url, region_name=settings.region,
            config=config))
        client.meta.events.register_first("needs-retry.s3", _refuse_redirect_answer)
        client.meta.events.register("before-sign.s3", _refuse_redirected)
        self._stack = stack
        return client

    async def close(self) -> None:
        """Close the client (a later call creates a new one)."""
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()


# What a request to the store may raise (anything else is a bug and propagates).
STORE_ERRORS: Final = (BotoCoreError, ClientError, RedirectRefused, aiohttp.ClientError,
                        asyncio.TimeoutError, OSError)


def store_error_outcome(exc: BaseException) -> _Outcome:
    """What a failed request to the store means (no key, bucket or content in the detail)."""
    if isinstance(exc, RedirectRefused):
        return _Outcome("denied", "the object store answered with a redirect (not followed)")
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError)):
        return _Outcome("denied", "no credentials for the object store")
    if isinstance(exc, ClientError):
        error = exc.response.get("Error")
        code = str(error.get("Code") or "") if error else ""
        meta = exc.response.get("ResponseMetadata")
        status = int(meta.get("HTTPStatusCode") or 0) if meta else 0
        if 300 <= status < 400 or code in _REDIRECT_CODES:
            return _Outcome("denied", "the object store answered with a redirect (not followed)")
        if status == 404 or code in _MISSING_CODES:
            return _Outcome("missing", "no such object")
        if status == 412:
            return _Outcome("corrupt", "object was replaced while being read")
        if 400 <= status < 500:
            return _Outcome("denied", f"the object store refused access ({code or status})")
        return _Outcome("missing", f"the object store failed ({code or status})")
    return _Outcome("missing", f"the object store is unreachable ({type(exc).__name__})")
