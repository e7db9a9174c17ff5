"""Moving a session's objects from one tenant's prefix to another's (``move-session`` with
``s3://`` roots). S3 has no rename: every object is copied (one ``CopyObject``, up to 5 GB),
then the originals deleted; a failed copy deletes the copies made, so nothing moved.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from proxy.sources.migrate import MoveRefused
from proxy.sources.s3_client import STORE_ERRORS, S3ObjectStore
from proxy.sources.s3_roots import S3_SCHEME

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

__all__ = ["ObjectMove", "move_objects", "plan_object_moves"]

#: One object to move: its bucket, its key now, its key after.
ObjectMove = tuple[str, str, str]


def _split(url: str) -> tuple[str, str]:
    bucket, _, key = url.removeprefix(S3_SCHEME).partition("/")
    return bucket, key


async def _keys(client: S3Client, bucket: str, key: str) -> list[str]:
    """The keys under ``key`` when it ends with ``/`` (a session's folder), else ``key``
    itself if it exists."""
    found: list[str] = []
    paginator = client.get_paginator("list_objects_v2")
    async for page in paginator.paginate(Bucket=bucket, Prefix=key):
        found.extend(item["Key"] for item in page.get("Contents", ()))
    return found if key.endswith("/") else [k for k in found if k == key]


async def plan_object_moves(store: S3ObjectStore, moves: Sequence[tuple[str, str]]
                            ) -> list[ObjectMove]:
    """Each object under each ``(source, target)`` URL pair (a key, or a prefix ending with
    ``/``), with its key under the target; MoveRefused when a target holds objects already."""
    planned: list[ObjectMove] = []
    try:
        client = await store.client()
        for source, target in moves:
            bucket, source_key = _split(source)
            _, target_key = _split(target)
            if await _keys(client, bucket, target_key):
                raise MoveRefused(f"{target} holds objects already; remove them first")
            planned.extend((bucket, key, target_key + key[len(source_key):])
                           for key in await _keys(client, bucket, source_key))
    except STORE_ERRORS as exc:
        raise MoveRefused(f"the object store failed: {type(exc).__name__}; nothing moved"
                          ) from None
    return planned


async def move_objects(store: S3ObjectStore, planned: Sequence[ObjectMove]) -> None:
    """Copy every planned object, then delete the originals; MoveRefused when a copy failed
    (the copies made are deleted again) or a delete did (the message says what is left)."""
    client = await store.client()
    copied: list[tuple[str, str]] = []
    try:
        for bucket, source, target in planned:
            await client.copy_object(Bucket=bucket, Key=target,
                                     CopySource={"Bucket": bucket, "Key": source})
            copied.append((bucket, target))
    except STORE_ERRORS as exc:
        for bucket, target in copied:
            await client.delete_object(Bucket=bucket, Key=target)
        raise MoveRefused(f"copying an object failed: {type(exc).__name__}; nothing moved"
                          ) from None
    try:
        for bucket, source, _ in planned:
            await client.delete_object(Bucket=bucket, Key=source)
    except STORE_ERRORS as exc:
        raise MoveRefused(f"every object was copied, but deleting the originals failed "
                          f"({type(exc).__name__}): delete them under the source prefix"
                          ) from None
