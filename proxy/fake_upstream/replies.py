"""What the fake upstream answers: scripted replies, the ``Message`` JSON and its SSE stream.

A :class:`Reply` says *what* to answer (content blocks, stop reason, or an error, plus optional
timing and faults); :func:`build_message` turns it into the provider's ``Message`` object and
:func:`stream_events` into the exact event sequence of reference §7 (``message_start``, ``ping``,
``content_block_start`` / ``content_block_delta`` … / ``content_block_stop`` per block,
``message_delta`` with cumulative usage, ``message_stop``).

Thinking the fake produces is signed the fake's way (:mod:`.signatures`): a ``thinking`` block
without a ``signature`` gets ``fakesig.…``, so a client that sends it back unchanged passes the
"cannot be modified" rule and one that edits it does not; :func:`redacted_thinking_block` makes
a verifiable ``redacted_thinking``. Explicit signatures are served as given (opaque).

Token numbers are deterministic estimates: the canonical JSON of ``tools``, ``system`` and
``messages`` (in the provider's prefix order) divided by four. A :class:`TokenRule` with a
``ratio`` or ``noise`` stands for a provider whose own tokenizer counts differently from any
client estimate: ``ratio × chars / 4`` per block of the canonical prompt, each block moved by a
deterministic noise of at most ``±noise`` from a hash of its bytes (:class:`PromptMeasure`).
:class:`PromptCache` simulates the prompt cache by remembering the canonical prompts of recent
requests per API key and reporting the longest common prefix with any of them, in the same
units, as ``cache_read_input_tokens``.

Everything in ``__all__`` gets re-exported.
"""

from __future__ import annotations

import hashlib
import json
import math
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final, Literal

from .signatures import redacted_data, sign_thinking

__all__ = [
    "MALFORMED_SSE_EVENT",
    "MALFORMED_SSE_TAIL",
    "Fault",
    "FaultKind",
    "PromptCache",
    "PromptMeasure",
    "Reply",
    "TokenRule",
    "Usage",
    "build_message",
    "canonical_prompt",
    "encode_event",
    "estimate_tokens",
    "output_tokens",
    "redacted_thinking_block",
    "stream_events",
    "text_block",
    "thinking_block",
    "tool_use_block",
    "without_cache_markers",
]

CHARS_PER_TOKEN: Final = 4
# Blocks streamed through ``input_json_delta`` fragments; everything else that is not text or
# thinking arrives complete in its ``content_block_start`` (redacted thinking, server results,
# unknown types), as the provider does.
JSON_INPUT_TYPES: Final = ("tool_use", "server_tool_use", "mcp_tool_use")
TEXT_FRAGMENTS: Final = 3
JSON_FRAGMENTS: Final = 3
PREFIX_CHUNK: Final = 64 * 1024

FaultKind = Literal["cut_after_events", "hang_before_first_byte", "close_connection", "error_event",
                    "slow_first_byte", "malformed_sse", "cut_mid_event"]
FAULT_KINDS: Final[tuple[FaultKind, ...]] = (
    "cut_after_events",
    "hang_before_first_byte",
    "close_connection",
    "error_event",
    "slow_first_byte",
    "malformed_sse",
    "cut_mid_event",
)
#: What ``malformed_sse`` sends after its valid events: a ``data`` line that is not JSON, then
#: bytes that are not SSE at all (no field name, not UTF-8, no terminating blank line).
MALFORMED_SSE_EVENT: Final = (
    b'event: content_block_delta\ndata: {"type": "content_block_delta", <<not json\n\n'
)
MALFORMED_SSE_TAIL: Final = b"\x00\xff\xfe garbage that is not an SSE field"


@dataclass(frozen=True)
class Fault:
    """A misbehaviour to inject while serving one reply.

    Kinds:
        ``cut_after_events``: stream ``after_events`` SSE events, then drop the connection
            without ``message_stop`` (non-streaming: send half the JSON body, then drop).
        ``hang_before_first_byte``: wait ``hang_s`` seconds before sending anything.
        ``close_connection``: close the connection without any response.
        ``error_event``: stream ``after_events`` events, then an ``event: error`` carrying
            ``error`` (default ``overloaded_error``), then end the stream normally.
        ``slow_first_byte``: wait ``hang_s`` seconds, then answer normally.
        ``malformed_sse``: stream ``after_events`` events, then :data:`MALFORMED_SSE_EVENT`
            and :data:`MALFORMED_SSE_TAIL`, then end the stream normally (no
            ``message_stop``); a non-streaming request gets a body that is not JSON.
        ``cut_mid_event``: stream ``after_events`` events, then the first half of the next
            one's bytes, then drop the connection (non-streaming: as ``cut_after_events``).
    """

    kind: FaultKind
    after_events: int = 0
    hang_s: float = 3600.0
    error: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"Fault.kind must be one of {FAULT_KINDS}, got {self.kind!r}")
        if self.after_events < 0:
            raise ValueError(f"Fault.after_events must be >= 0, got {self.after_events}")
        if self.hang_s < 0:
            raise ValueError(f"Fault.hang_s must be >= 0, got {self.hang_s}")

    def error_payload(self) -> dict[str, Any]:
        """The ``data`` of the ``error`` event this fault sends."""
        error = dict(self.error) if self.error is not None else {
            "type": "overloaded_error",
            "message": "Overloaded",
        }
        return {"type": "error", "error": error}


@dataclass(frozen=True)
class Reply:
    """One scripted answer of the fake upstream.

    Attributes:
        content: the assistant content blocks (dicts as the provider returns them).
        stop_reason: ``end_turn``, ``tool_use``, ``max_tokens``, ….
        stop_sequence: the matched stop sequence, usually ``None``.
        status: the HTTP status (200 for a message; the error status when ``error`` is set).
        headers: extra response headers (e.g. ``retry-after``).
        error: when set, the answer is this Anthropic error body (``{"type": "error",
            "error": {...}}``) with ``status``; ``request_id`` is added by the server.
        event_delay_s: pause between two SSE events (streaming only), to prove per-event relay.
        fault: an optional :class:`Fault` to inject.
    """

    content: Sequence[Mapping[str, Any]] = ()
    stop_reason: str = "end_turn"
    stop_sequence: str | None = None
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    error: Mapping[str, Any] | None = None
    event_delay_s: float = 0.0
    fault: Fault | None = None

    def __post_init__(self) -> None:
        blocks = tuple(self.content)
        for k, block in enumerate(blocks):
            if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
                raise ValueError(f"Reply.content[{k}] must be a block mapping with a 'type'")
        object.__setattr__(self, "content", blocks)
        object.__setattr__(self, "headers", dict(self.headers))
        if not 100 <= self.status <= 599:
            raise ValueError(f"Reply.status must be an HTTP status, got {self.status}")
        if self.error is not None and self.status < 400:
            raise ValueError(f"Reply.status must be >= 400 with an error, got {self.status}")
        if self.error is None and self.status >= 400:
            raise ValueError("Reply.error is required when Reply.status >= 400")
        if self.event_delay_s < 0:
            raise ValueError(f"Reply.event_delay_s must be >= 0, got {self.event_delay_s}")

    @classmethod
    def text(cls, text: str, **options: Any) -> Reply:
        """A reply holding one text block."""
        return cls(content=(text_block(text),), **options)

    @classmethod
    def tool_call(
        cls,
        name: str,
        tool_input: Mapping[str, Any],
        *,
        tool_use_id: str,
        text: str | None = None,
        **options: Any,
    ) -> Reply:
        """A reply asking for one client tool call (optionally after a text block)."""
        blocks: list[Mapping[str, Any]] = [] if text is None else [text_block(text)]
        blocks.append(tool_use_block(tool_use_id, name, tool_input))
        return cls(content=tuple(blocks), stop_reason="tool_use", **options)

    @classmethod
    def api_error(
        cls, status: int, error_type: str, message: str, *, headers: Mapping[str, str] | None = None
    ) -> Reply:
        """A reply that answers with the Anthropic error shape and ``status``."""
        return cls(
            status=status,
            error={"type": "error", "error": {"type": error_type, "message": message}},
            headers=dict(headers or {}),
        )


def text_block(text: str) -> dict[str, Any]:
    """A ``text`` content block."""
    return {"type": "text", "text": text}


def thinking_block(thinking: str, signature: str | None = None) -> dict[str, Any]:
    """A ``thinking`` content block; without ``signature`` the fake signs it itself
    (``fakesig.…``, verified when it comes back), with one it is served as given (opaque)."""
    if signature is None:
        signature = sign_thinking(thinking)
    return {"type": "thinking", "thinking": thinking, "signature": signature}


def redacted_thinking_block(payload: str) -> dict[str, Any]:
    """A ``redacted_thinking`` block whose ``data`` the fake can verify when it comes back."""
    return {"type": "redacted_thinking", "data": redacted_data(payload)}


def _signed(block: Mapping[str, Any]) -> dict[str, Any]:
    """A reply block as served: a ``thinking`` block without a signature gets the fake's."""
    served = dict(block)
    if served.get("type") == "thinking" and served.get("signature") is None:
        served["signature"] = sign_thinking(str(served.get("thinking", "")))
    return served


def tool_use_block(tool_use_id: str, name: str, tool_input: Mapping[str, Any]) -> dict[str, Any]:
    """A client ``tool_use`` content block."""
    return {"type": "tool_use", "id": tool_use_id, "name": name, "input": dict(tool_input)}


# -- token estimates and the simulated prompt cache ---------------------------------------------


def without_cache_markers(value: Any) -> Any:
    """``value`` with every ``cache_control`` field left out, at any depth: a marker says
    where to cache, it is not content (it is neither counted nor part of the cache key)."""
    if isinstance(value, list):
        return [without_cache_markers(item) for item in value]
    if isinstance(value, dict):
        return {key: without_cache_markers(item) for key, item in value.items()
                if key != "cache_control"}
    return value


def canonical_prompt(body: Mapping[str, Any]) -> str:
    """The prompt as one canonical string, in the provider's prefix order tools → system →
    messages, without cache markers, so that a request extending an earlier one shares its
    prefix even though the client moved its breakpoint to the newest block."""
    return json.dumps(
        without_cache_markers([body.get("tools"), body.get("system"), body.get("messages")]),
        ensure_ascii=False,
        separators=(",", ":"),
        sort_keys=True,
    )


def estimate_tokens(canonical: str) -> int:
    """The deterministic token estimate of a canonical prompt: characters / 4, at least 1."""
    return max(1, len(canonical) // CHARS_PER_TOKEN)


def _as_fraction(value: float | int | str | Fraction, name: str) -> Fraction:
    """``value`` as an exact fraction (a float by its shortest decimal: 1.3 is 13/10)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Fraction)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def _block_texts(body: Mapping[str, Any]) -> Iterator[Any]:
    """The values whose canonical JSON is one block, in prompt order: each tool, each system
    block (or the system string), each message's content block (or its string content)."""
    for part in (body.get("tools"), body.get("system")):
        if isinstance(part, list):
            yield from part
        elif part is not None:
            yield part
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            yield from content
        elif content is not None:
            yield content


def _block_cuts(body: Mapping[str, Any], canonical: str) -> list[int]:
    """Where the canonical prompt is cut into blocks: each block's canonical JSON is found in
    order, and the JSON between two blocks (brackets, roles, keys) is a piece of its own."""
    cuts = {0, len(canonical)}
    position = 0
    for value in _block_texts(without_cache_markers(body)):
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
        start = canonical.find(text, position)
        if start < 0:
            continue
        cuts.update((start, start + len(text)))
        position = start + len(text)
    return sorted(cuts)


class PromptMeasure:
    """One prompt counted by one :class:`TokenRule`: its whole ``total`` and the count of any
    prefix (:meth:`tokens_upto`), so that a cache read of a prefix and the rest add up."""

    def __init__(self, canonical: str, cuts: Sequence[int] = (),
                 weights: Sequence[Fraction] = ()) -> None:
        """``cuts`` (ascending, from 0 to ``len(canonical)``) split ``canonical`` into pieces
        counted at ``weights[i]`` tokens per 4 characters; none means characters / 4."""
        self.canonical = canonical
        self._cuts = list(cuts)
        self._weights = list(weights)
        self._before: list[Fraction] = [Fraction(0)]
        for k, weight in enumerate(self._weights):
            length = self._cuts[k + 1] - self._cuts[k]
            self._before.append(self._before[-1] + weight * length / CHARS_PER_TOKEN)
        self.total = max(1, self._exact_upto(len(canonical)))

    def _exact_upto(self, chars: int) -> int:
        if not self._weights:
            return chars // CHARS_PER_TOKEN
        chars = max(0, min(chars, len(self.canonical)))
        piece = min(bisect_right(self._cuts, chars) - 1, len(self._weights) - 1)
        inside = chars - self._cuts[piece]
        return math.floor(
            self._before[piece] + self._weights[piece] * inside / CHARS_PER_TOKEN)

    def tokens_upto(self, chars: int) -> int:
        """The tokens of the first ``chars`` characters (a piece cut short counts pro rata),
        never more than :attr:`total`."""
        return min(self.total, self._exact_upto(chars))


class TokenRule:
    """How the provider counts input tokens.

    The default (``ratio`` 1, ``noise`` 0) is the plain estimate, characters / 4 over the whole
    canonical prompt (:func:`estimate_tokens`). Otherwise the canonical prompt is cut into
    blocks (:func:`_block_cuts`) and each counts ``ratio × chars / 4 × (1 + noise × u)``, where
    ``u`` in [-1, 1] comes from a hash of the block's bytes: the same block always counts the
    same, whatever its position. Arithmetic is exact (fractions), floored once at the end.
    """

    def __init__(self, ratio: float | int | str | Fraction = 1,
                 noise: float | int | str | Fraction = 0) -> None:
        self.ratio = _as_fraction(ratio, "token_ratio")
        self.noise = _as_fraction(noise, "token_noise")
        if self.ratio <= 0:
            raise ValueError(f"token_ratio must be > 0, got {ratio!r}")
        if not 0 <= self.noise < 1:
            raise ValueError(f"token_noise must be in [0, 1), got {noise!r}")

    @property
    def is_plain(self) -> bool:
        """Whether this is the default count, characters / 4."""
        return self.ratio == 1 and self.noise == 0

    def _weight(self, piece: str) -> Fraction:
        if not self.noise:
            return self.ratio
        digest = hashlib.blake2b(piece.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        spread = Fraction(int.from_bytes(digest, "big") % 2001 - 1000, 1000)
        return self.ratio * (1 + self.noise * spread)

    def measure(self, body: Mapping[str, Any]) -> PromptMeasure:
        """Count the prompt of a request body (``tools``, ``system``, ``messages``)."""
        canonical = canonical_prompt(body)
        if self.is_plain:
            return PromptMeasure(canonical)
        cuts = _block_cuts(body, canonical)
        weights = [self._weight(canonical[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]
        return PromptMeasure(canonical, cuts, weights)


@dataclass(frozen=True)
class Usage:
    """The input side of ``usage``: the three parts sum to the whole prompt estimate."""

    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int

    def as_dict(self) -> dict[str, int]:
        """The three counts as the provider names them."""
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
        }


def _common_prefix_length(a: str, b: str) -> int:
    # Compare in 64 KiB chunks (each comparison is a C memcmp on a copied slice), then binary
    # search inside the first chunk that differs: linear in the shared prefix, copying each
    # character about twice, instead of a per-character Python loop.
    limit = min(len(a), len(b))
    position = 0
    while position < limit:
        end = min(position + PREFIX_CHUNK, limit)
        if a[position:end] == b[position:end]:
            position = end
            continue
        low, high = position, end - 1
        while low < high:
            middle = (low + high + 1) // 2
            if a[position:middle] == b[position:middle]:
                low = middle
            else:
                high = middle - 1
        return low
    return limit


class PromptCache:
    """A deterministic stand-in for the provider's prompt cache.

    Per cache key (the server uses API key and model) it keeps the canonical prompts of the
    last ``max_entries`` successful requests that carried ``cache_control`` markers (only a
    breakpoint writes the cache). For such a request ``cache_read_input_tokens`` is the longest
    common prefix with any of them (in tokens, as the request's :class:`PromptMeasure` counts
    that prefix) and the rest of the prompt counts as written (``cache_creation_input_tokens``).
    A request without any marker neither reads nor writes: its whole prompt is plain
    ``input_tokens`` (the provider caches only what a breakpoint names, reference §5.5).
    """

    def __init__(self, max_entries: int = 16) -> None:
        if max_entries < 1:
            raise ValueError(f"PromptCache.max_entries must be >= 1, got {max_entries}")
        self._max_entries = max_entries
        self._entries: dict[str, deque[str]] = {}

    def usage(self, cache_key: str, prompt: str | PromptMeasure, *,
              has_breakpoints: bool) -> Usage:
        """Report the usage of a canonical prompt (counted characters / 4, or by the
        :class:`PromptMeasure` given) and remember it for later requests."""
        measure = PromptMeasure(prompt) if isinstance(prompt, str) else prompt
        canonical = measure.canonical
        total = measure.total
        if not has_breakpoints:
            return Usage(input_tokens=total, cache_creation_input_tokens=0,
                         cache_read_input_tokens=0)
        entries = self._entries.setdefault(cache_key, deque(maxlen=self._max_entries))
        prefix = max((_common_prefix_length(canonical, old) for old in entries), default=0)
        read = measure.tokens_upto(prefix)
        if canonical not in entries:
            entries.append(canonical)
        return Usage(input_tokens=0, cache_creation_input_tokens=total - read,
                     cache_read_input_tokens=read)


def output_tokens(content: Iterable[Mapping[str, Any]]) -> int:
    """The deterministic output-token estimate of the reply content (at least 1)."""
    chars = 0
    for block in content:
        for key in ("text", "thinking"):
            value = block.get(key)
            if isinstance(value, str):
                chars += len(value)
        if "input" in block:
            chars += len(json.dumps(block["input"], separators=(",", ":")))
    return max(1, chars // CHARS_PER_TOKEN)


# -- the Message and its stream ------------------------------------------------------------------


def build_message(reply: Reply, *, message_id: str, model: str, usage: Usage) -> dict[str, Any]:
    """The ``Message`` JSON the provider would return for ``reply``."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [_signed(block) for block in reply.content],
        "stop_reason": reply.stop_reason,
        "stop_sequence": reply.stop_sequence,
        "usage": {
            **usage.as_dict(),
            "output_tokens": output_tokens(reply.content),
            "service_tier": "standard",
        },
    }


def _fragments(text: str, parts: int) -> list[str]:
    """``text`` cut into up to ``parts`` non-empty consecutive pieces (one piece if short)."""
    if not text:
        return [""]
    size = max(1, -(-len(text) // parts))
    return [text[i:i + size] for i in range(0, len(text), size)]


def _block_events(index: int, block: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    block_type = block["type"]
    events: list[tuple[str, dict[str, Any]]] = []

    def start(content_block: Mapping[str, Any]) -> None:
        events.append(("content_block_start", {
            "type": "content_block_start", "index": index, "content_block": dict(content_block),
        }))

    def delta(payload: dict[str, Any]) -> None:
        events.append(("content_block_delta", {
            "type": "content_block_delta", "index": index, "delta": payload,
        }))

    if block_type == "text":
        start({**block, "text": ""})
        for piece in _fragments(str(block.get("text", "")), TEXT_FRAGMENTS):
            delta({"type": "text_delta", "text": piece})
    elif block_type == "thinking":
        start({"type": "thinking", "thinking": "", "signature": ""})
        for piece in _fragments(str(block.get("thinking", "")), TEXT_FRAGMENTS):
            delta({"type": "thinking_delta", "thinking": piece})
        delta({"type": "signature_delta", "signature": str(block.get("signature", ""))})
    elif block_type in JSON_INPUT_TYPES:
        start({**block, "input": {}})
        # The provider's first fragment is often empty; clients must concatenate regardless.
        delta({"type": "input_json_delta", "partial_json": ""})
        encoded = json.dumps(block.get("input", {}), ensure_ascii=False)
        for piece in _fragments(encoded, JSON_FRAGMENTS):
            delta({"type": "input_json_delta", "partial_json": piece})
    else:
        start(block)
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def stream_events(message: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events, as ``(event name, data)``, that stream ``message`` (reference §7)."""
    usage = dict(message["usage"])
    start_usage = {key: usage[key] for key in (
        "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
    )}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": {
            **message,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**start_usage, "output_tokens": 1, "service_tier": "standard"},
        }}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(message["content"]):
        events.extend(_block_events(index, block))
    events.append(("message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
        "usage": {**start_usage, "output_tokens": usage["output_tokens"]},
    }))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def encode_event(name: str, data: Mapping[str, Any]) -> bytes:
    """One SSE event on the wire: ``event: <name>\\ndata: <json>\\n\\n``."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {payload}\n\n".encode()
