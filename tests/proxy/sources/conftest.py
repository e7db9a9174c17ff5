"""Fixtures of the s3:// source tests: a moto server on loopback, its client, a bucket, AWS env."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from proxy.sources.s3_client import S3ObjectStore
from tests.proxy.sources.s3_helpers import new_store, setup_client
from tests.s3_server import MotoServer, MotoServerUnavailable
from tests.servers import started

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

# --- the server and the objects --------------------------------------------------------------


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    """One moto server per test process (each test has its own bucket)."""
    with started(MotoServer(), MotoServerUnavailable) as server:
        yield server


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Credentials from the standard variables only (no profile, no instance metadata)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


@pytest.fixture
async def s3(moto: MotoServer) -> AsyncIterator[S3Client]:
    async with setup_client(moto.url) as client:
        yield client


@pytest.fixture
async def bucket(s3: S3Client) -> str:
    name = f"src-{uuid.uuid4().hex[:16]}"
    await s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
async def store(moto: MotoServer) -> AsyncIterator[S3ObjectStore]:
    objects = new_store(moto.url)
    try:
        yield objects
    finally:
        await objects.close()
