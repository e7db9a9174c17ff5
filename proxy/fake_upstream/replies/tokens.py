"""Token numbers and the simulated prompt cache, all deterministic.

The estimate is the canonical JSON of ``tools``, ``system`` and ``messages`` (in the provider's
prefix order) divided by four. A :class:`TokenRule` with a ``ratio`` or ``noise`` stands for a
provider whose own tokenizer counts differently from any client estimate: ``ratio × chars / 4``
per block of the canonical prompt, each block moved by a deterministic noise of at most
``±noise`` from a hash of its bytes (:class:`PromptMeasure`). :class:`PromptCache` simulates the
prompt cache by remembering the canonical prompts of recent requests per API key and reporting
the longest common prefix with any of them, in the same units, as ``cache_read_input_tokens``.
"""

from __future__ import annotations

import hashlib
import json
import math
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

CHARS_PER_TOKEN: Final = 4
PREFIX_CHUNK: Final = 64 * 1024


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
