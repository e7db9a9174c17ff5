"""s3:// source pointers against moto: authorization, names, redirects, an unreachable store."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import aiohttp
import pytest
from aiohttp import web

from proxy.sources.s3_client import S3ObjectStore
from proxy.sources.s3_roots import S3Settings
from proxy.sources.s3_sources import new_outcome_cache
from tests.proxy.sources.s3_helpers import (
    OTHER,
    REPORT,
    REPORT_SHA,
    SESSION,
    SID,
    event,
    new_store,
    put_artifact,
    put_transcript,
    resolver_for,
)
from tests.redis_server import free_port
from tests.s3_server import MotoServer

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

# --- authorization, names, redirects, an unreachable store ----------------------------------


async def test_a_key_of_another_session_is_denied_before_any_request(
        s3: S3Client, bucket: str, store: S3ObjectStore) -> None:
    """The other session's objects exist, yet its pointers are denied; against a store that
    cannot be reached the own session's pointer is missing while the other's is still denied
    (so no request was needed to deny it)."""
    await put_transcript(s3, bucket, [event(1, session=OTHER)], session=OTHER)
    await put_artifact(s3, bucket, "report.txt", REPORT, session=OTHER)
    other_pointers = ["transcript:sess-other:1", f"artifact:sess-other:report.txt:{REPORT_SHA}"]
    resolver = resolver_for(store, bucket)
    for pointer in other_pointers:
        result = await resolver.resolve(pointer)
        assert (result.status, result.detail) == ("denied", "not authorized for this session")
    # The owner resolves them: they are there.
    owner = resolver_for(store, bucket, session=OTHER)
    assert [(await owner.resolve(p)).status for p in other_pointers] == ["available"] * 2

    dead = new_store(f"http://127.0.0.1:{free_port()}")
    try:
        offline = resolver_for(dead, bucket)
        own = await offline.resolve("transcript:sess-s3:1")
        assert own.status == "missing" and own.detail.startswith("the object store is unreachable")
        for pointer in other_pointers:
            assert (await offline.resolve(pointer)).detail == "not authorized for this session"
    finally:
        await dead.close()


@pytest.mark.parametrize("pointer", [
    f"artifact:sess-s3:..:{REPORT_SHA}",
    f"artifact:sess-s3:.:{REPORT_SHA}",
    f"artifact:sess-s3:../sess-other/report.txt:{REPORT_SHA}",
    f"artifact:sess-s3:%2e%2e%2fsess-other%2freport.txt:{REPORT_SHA}",
    f"artifact:sess-s3:..%2Fsess-other%2Freport.txt:{REPORT_SHA}",
    f"artifact:sess-s3:a%2Fb:{REPORT_SHA}",
    f"artifact:sess-s3:..%5creport.txt:{REPORT_SHA}",
    f"artifact:sess-s3:/team/artifacts/sess-other/report.txt:{REPORT_SHA}",
    f"artifact:sess-s3:..\\sess-other\\report.txt:{REPORT_SHA}",
    f"artifact:..:report.txt:{REPORT_SHA}",
    f"artifact:sess-s3/../sess-other:report.txt:{REPORT_SHA}",
    "transcript:../sess-other:1",
    "transcript:sess-s3/../sess-other:1",
    "transcript:%2e%2e:1",
])
async def test_names_escaping_the_session_prefix_are_denied(
        s3: S3Client, bucket: str, store: S3ObjectStore, pointer: str) -> None:
    """Pointers carry names, never URLs: traversal, absolute and percent-encoded names are
    refused before a key is built, even where the key they aim at exists (S3 keys may
    literally contain ``..``)."""
    await put_artifact(s3, bucket, "report.txt", REPORT, session=OTHER)
    await s3.put_object(Bucket=bucket, Key=f"team/artifacts/{SID}/../{OTHER}/report.txt",
                        Body=REPORT)
    await s3.put_object(Bucket=bucket, Key="team/transcripts/../sess-other.jsonl",
                        Body=(event(1, session="..") + "\n").encode())
    result = await resolver_for(store, bucket).resolve(pointer)
    assert result.status == "denied", result
    assert result.detail.startswith(("malformed pointer", "not authorized")), result


class RedirectingServer:
    """A real HTTP server on loopback answering every request with a redirect; counts them."""

    def __init__(self, status: int, location: str | None, headers: dict[str, str]) -> None:
        self.status = status
        self.location = location
        self.headers = headers
        self.requests: list[str] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append(f"{request.method} {request.path}")
        headers = dict(self.headers)
        if self.location is not None:
            headers["Location"] = self.location + request.path_qs
        body = b""
        if request.method != "HEAD":
            code = {301: "PermanentRedirect", 400: "AuthorizationHeaderMalformed"}.get(
                self.status, "TemporaryRedirect")
            body = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code>"
                    "<Message>Please use the other endpoint.</Message>"
                    "<Region>eu-west-1</Region></Error>").encode()
        return web.Response(status=self.status, headers=headers, body=body,
                            content_type="application/xml")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.mark.parametrize("status, region_header", [
    (307, False),   # Location to the real store, which holds the object
    (302, False),
    (301, True),    # S3's wrong-region answer: botocore would re-send it to that region
    (307, True),
    (400, True),    # a wrong-region answer without a 3xx: the re-sent request is refused
])
async def test_a_redirect_is_denied_and_never_followed(
        s3: S3Client, bucket: str, moto: MotoServer, status: int, region_header: bool) -> None:
    await put_artifact(s3, bucket, "report.txt", REPORT)
    await put_transcript(s3, bucket, [event(1)])
    target = RedirectingServer(200, None, {})  # where Location points: must see nothing
    await target.start()
    headers = {"x-amz-bucket-region": "eu-west-1"} if region_header else {}
    redirector = RedirectingServer(status, target.url if status < 400 else None, headers)
    await redirector.start()
    objects = new_store(redirector.url)
    try:
        resolver = resolver_for(objects, bucket)
        for pointer in (f"artifact:sess-s3:report.txt:{REPORT_SHA}", "transcript:sess-s3:1"):
            result = await resolver.resolve(pointer)
            assert (result.status, result.detail) == (
                "denied", "the object store answered with a redirect (not followed)"), result
        assert target.requests == []
        # One HEAD per pointer: no second attempt, no probe of the bucket's region.
        assert redirector.requests == [f"HEAD /{bucket}/team/artifacts/{SID}/report.txt",
                                       f"HEAD /{bucket}/team/transcripts/{SID}.jsonl"]
        # The same store reached directly has the objects.
        direct = resolver_for(new_store(moto.url), bucket)
        assert (await direct.resolve("transcript:sess-s3:1")).status == "available"
        await direct._store.close()
    finally:
        await objects.close()
        await redirector.stop()
        await target.stop()


async def test_an_unreachable_store_is_missing_and_not_remembered(
        s3: S3Client, bucket: str, moto: MotoServer) -> None:
    """A refused connection is missing; the same resolver sees the object once it is back
    (here: the cache shared with a resolver on the reachable endpoint kept no failure)."""
    await put_artifact(s3, bucket, "report.txt", REPORT)
    cache = new_outcome_cache()
    pointer = f"artifact:sess-s3:report.txt:{REPORT_SHA}"
    dead = new_store(f"http://127.0.0.1:{free_port()}")
    try:
        started = time.monotonic()
        result = await resolver_for(dead, bucket, cache=cache).resolve(pointer)
        assert result.status == "missing"
        assert result.detail.startswith("the object store is unreachable")
        assert time.monotonic() - started < 10
    finally:
        await dead.close()
    assert cache is not None and len(cache) == 0
    live = new_store(moto.url)
    try:
        assert (await resolver_for(live, bucket, cache=cache).resolve(pointer)).status == \
            "available"
    finally:
        await live.close()


async def test_bad_credentials_are_denied(s3: S3Client, bucket: str, moto: MotoServer,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """No credentials at all (a fresh session looks them up): denied."""
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    await put_artifact(s3, bucket, "report.txt", REPORT)
    objects = S3ObjectStore(S3Settings(endpoint_url=moto.url))
    try:
        result = await resolver_for(objects, bucket).resolve(
            f"artifact:sess-s3:report.txt:{REPORT_SHA}")
        assert (result.status, result.detail) == ("denied", "no credentials for the object store")
    finally:
        await objects.close()


async def set_moto_auth(moto: MotoServer, checked_after: str) -> None:
    """Turn moto's request authentication on (``"0"``: from the next request) or off
    (``"inf"``) through its own API."""
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{moto.url}/moto-api/reset-auth", data=checked_after) as resp:
            assert resp.status == 200, await resp.text()


async def test_forged_or_unknown_credentials_are_denied(
        s3: S3Client, bucket: str, moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """With moto checking signatures against its IAM users: the user's real key reads the
    object; the same key id with a forged secret (a signature that does not verify) and an
    unknown key id are refused by the store: denied."""
    await put_artifact(s3, bucket, "report.txt", REPORT)
    async with SESSION.create_client("iam", endpoint_url=moto.url,
                                     region_name="us-east-1") as iam:
        await iam.create_user(UserName="reader")
        await iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=json.dumps(
            {"Version": "2012-10-17",
             "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = (await iam.create_access_key(UserName="reader"))["AccessKey"]
    pointer = f"artifact:sess-s3:report.txt:{REPORT_SHA}"
    cases = [(key["AccessKeyId"], key["SecretAccessKey"], "available"),
             (key["AccessKeyId"], "forged" + key["SecretAccessKey"][6:], "denied"),
             ("AKIAUNKNOWN000000000", key["SecretAccessKey"], "denied")]
    await set_moto_auth(moto, "0")
    try:
        for key_id, secret, status in cases:
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
            # A fresh session: it looks the credentials up again.
            objects = S3ObjectStore(S3Settings(endpoint_url=moto.url, region="us-east-1"))
            try:
                result = await resolver_for(objects, bucket).resolve(pointer)
            finally:
                await objects.close()
            assert result.status == status, (key_id, result)
            if status == "denied":
                assert result.detail.startswith("the object store refused access"), result
    finally:
        await set_moto_auth(moto, "inf")
