"""The proxy's SigV4 signer against botocore's own, over the paths Claude Code sends."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from yarl import URL

from proxy.providers.sigv4 import SigV4

NOW = datetime(2026, 12, 5, 21, 30, 7, tzinfo=UTC)
BODY = b'{"anthropic_version":"bedrock-2023-05-31","max_tokens":5,"messages":[]}'


@pytest.mark.parametrize("url", [
    "https://bedrock-runtime.us-east-1.amazonaws.com/model/"
    "us.anthropic.claude-sonnet-4-5-20250929-v1:0/invoke-with-response-stream",
    "http://127.0.0.1:8788/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3A"
    "inference-profile%2Fus.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke",
    "https://bedrock-runtime.eu-west-1.amazonaws.com/inference-profiles?typeEquals="
    "SYSTEM_DEFINED&maxResults=1000",
])
@pytest.mark.parametrize("token", [None, "session-token+/="])
def test_the_signature_is_botocores(url: str, token: str | None) -> None:
    credentials = Credentials("AKIAEXAMPLE000000001", "secret/key+example", token)
    mine = SigV4("us-east-1").headers("POST", URL(url, encoded=True), BODY, credentials, NOW)
    request = AWSRequest(method="POST", url=url, data=BODY,
                         headers={"X-Amz-Date": mine["X-Amz-Date"],
                                  **({"X-Amz-Security-Token": token} if token else {})})
    request.context["timestamp"] = "20261205T213007Z"
    auth = SigV4Auth(credentials, "bedrock", "us-east-1")
    expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)),
                              request)
    assert mine["X-Amz-Date"] == "20261205T213007Z"
    assert mine["Authorization"].endswith(f"Signature={expected}")
    assert mine["Authorization"].startswith(
        "AWS4-HMAC-SHA256 Credential=AKIAEXAMPLE000000001/20261205/us-east-1/bedrock/"
        "aws4_request, SignedHeaders=host;x-amz-date" + (";x-amz-security-token" if token
                                                         else "") + ", ")
    assert mine.get("X-Amz-Security-Token") == token
