"""Source roots on an object store: ``s3://<bucket>/<prefix>``, parsed strictly and without
any S3 client (the config is checked where the ``s3`` extra is not installed).

Objects sit under a root as files under a local one (``<prefix><session_id>.jsonl``,
``<prefix><session_id>/<filename>``); prefix segments are S3's "safe" characters, never ``.``
or ``..``, so no root can hide a traversal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = ["S3_SCHEME", "S3Root", "S3Settings", "is_s3_url", "parse_s3_root"]

S3_SCHEME: Final = "s3://"

# AWS's rule for bucket names (3-63 of lowercase letters, digits, dots and hyphens, starting
# and ending with a letter or digit); S3-compatible stores accept at least these.
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", re.ASCII)
# S3's "safe characters" for key names: a prefix segment is made of them only.
_SEGMENT_RE = re.compile(r"[A-Za-z0-9!_.*'()-]+", re.ASCII)


def is_s3_url(root: str) -> bool:
    """Whether a configured root is an object-store URL (``s3://...``) rather than a path."""
    return root.startswith(S3_SCHEME)


@dataclass(frozen=True, slots=True)
class S3Root:
    """A bucket and a key prefix (``""`` or segments each followed by ``/``), from
    :func:`parse_s3_root`."""

    bucket: str
    prefix: str

    def __str__(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.prefix}"

    def session_prefix(self, session_id: str) -> str:
        """The prefix under which only ``session_id``'s artifacts live."""
        return f"{self.prefix}{session_id}/"

    def transcript_key(self, session_id: str) -> str:
        """The key of ``session_id``'s transcript."""
        return f"{self.prefix}{session_id}.jsonl"

    def artifact_key(self, session_id: str, filename: str) -> str:
        """The key of one of ``session_id``'s artifacts."""
        return f"{self.session_prefix(session_id)}{filename}"


def parse_s3_root(url: str) -> S3Root:
    """Parse ``s3://<bucket>[/<prefix>]``; a ValueError names what is wrong."""
    if not is_s3_url(url):
        raise ValueError(f"must start with {S3_SCHEME}, got {url!r}")
    rest = url[len(S3_SCHEME):]
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
        raise ValueError(f"{bucket!r} is not a bucket name (3-63 of a-z 0-9 . -, starting "
                         "and ending with a letter or digit)")
    prefix = prefix.removesuffix("/")
    segments = prefix.split("/") if prefix else []
    for segment in segments:
        if segment in (".", "..") or not _SEGMENT_RE.fullmatch(segment):
            raise ValueError(f"prefix segment {segment!r} is not allowed (each segment is one "
                             "or more of A-Z a-z 0-9 ! _ . * ' ( ) -, never . or ..)")
    return S3Root(bucket, "".join(f"{segment}/" for segment in segments))


@dataclass(frozen=True, slots=True)
class S3Settings:
    """How to reach the store (``sources.s3``; docs/configuration.md). Credentials come from
    the standard AWS chain."""

    endpoint_url: str | None = None
    region: str | None = None
