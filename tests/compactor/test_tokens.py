"""Token counting: the two counters, the content-hash cache, images and documents."""

from __future__ import annotations

import base64
import json
import struct
import zlib

import pytest

from compactor import CachingCounter, Chars4Counter, TiktokenCounter, estimate_tokens
from compactor._fingerprint import fingerprint
from tests.paths import CORPUS

from .builders import long_session, text, tool_result, user


def _png(width: int, height: int, padding: int = 0) -> str:
    header = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(
        ">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    header += struct.pack(">I", zlib.crc32(header[12:29]))
    return base64.b64encode(header + b"\0" * padding).decode()


def _image(data: str, media_type: str = "image/png") -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def test_chars4_counts_four_characters_per_token_rounding_up() -> None:
    """chars4 is ceil(len / 4)."""
    counter = Chars4Counter()
    assert [counter.count_text(s) for s in ("", "abc", "abcd", "abcde")] == [0, 1, 1, 2]


def test_tiktoken_counter_uses_the_offline_cl100k_encoding() -> None:
    """The tiktoken counter needs no download and counts cl100k tokens."""
    counter = TiktokenCounter()
    assert counter.count_text("hello world") == 2
    assert counter.count_text("x" * 4000) < 4000


def test_a_repeated_history_is_counted_from_the_cache() -> None:
    """The second count of the same history is all cache hits."""
    counter = CachingCounter(Chars4Counter())
    messages = long_session(10)
    first = estimate_tokens(messages, counter)
    misses = counter.misses
    assert estimate_tokens(messages, counter) == first
    assert counter.misses == misses


def test_a_history_grown_by_one_message_costs_one_message() -> None:
    """Only the new message is counted when the history grows by one."""
    counter = CachingCounter(TiktokenCounter())
    messages = long_session(10)
    estimate_tokens(messages, counter)
    misses = counter.misses
    estimate_tokens([*messages, user("one more question")], counter)
    assert counter.misses == misses + 1


def test_the_cache_stays_within_its_bound() -> None:
    """The least recently used counts are evicted past max_entries."""
    counter = CachingCounter(Chars4Counter(), max_entries=5)
    for n in range(20):
        counter.count_message(user(f"message {n}"))
    assert len(counter) == 5


def test_image_is_estimated_from_its_dimensions_not_its_base64_length() -> None:
    """A 200x150 PNG costs about 200*150/750 tokens however large its data."""
    counter = CachingCounter(Chars4Counter())
    small = counter.count_value([_image(_png(200, 150))])
    padded = counter.count_value([_image(_png(200, 150, padding=300_000))])
    assert small == padded
    assert 40 <= small <= 45  # 200*150/750 = 40, plus block framing


def test_large_image_is_charged_after_the_providers_downscaling() -> None:
    """A 4000x3000 image is scaled down, so it costs at most about 1,600 tokens."""
    counter = CachingCounter(Chars4Counter())
    assert 1_400 <= counter.count_value([_image(_png(4000, 3000))]) <= 1_600


def test_unreadable_image_is_charged_the_maximum() -> None:
    """An image whose size cannot be read costs the default maximum."""
    counter = CachingCounter(Chars4Counter())
    assert counter.count_value([_image(base64.b64encode(b"garbage").decode())]) >= 1_600
    url_image = {"type": "image", "source": {"type": "url", "url": "https://example.org/a.png"}}
    assert counter.count_value([url_image]) >= 1_600


def test_pdf_document_is_estimated_per_page() -> None:
    """A three-page PDF costs three pages, not its byte size."""
    pdf = b"%PDF-1.4\n" + b"1 0 obj << /Type /Pages >>\n" + b"<< /Type /Page >>\n" * 3
    data = base64.b64encode(pdf + b" " * 90_000).decode()
    block = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                             "data": data}}
    tokens = CachingCounter(Chars4Counter()).count_value([block])
    assert 3 * 2_000 <= tokens <= 3 * 2_500


def test_images_inside_tool_results_are_estimated_the_same_way() -> None:
    """A screenshot returned by a tool is counted by its dimensions."""
    counter = CachingCounter(Chars4Counter())
    tokens = counter.count_message(user(tool_result("t", [_image(_png(750, 100, 50_000))])))
    assert tokens < 200


@pytest.mark.parametrize("block", [
    {"type": "fallback", "from": "a", "to": "b", "trigger": "x" * 400},
    {"type": "web_search_tool_result", "tool_use_id": "s", "content": [{"x": "y" * 400}]},
])
def test_unknown_and_server_blocks_still_count(block: dict) -> None:
    """Block types the counter does not know are counted from their JSON."""
    assert CachingCounter(Chars4Counter()).count_value([block]) > 100


def test_counts_are_the_same_for_string_and_block_content() -> None:
    """'hi' as a string and as a text block cost about the same."""
    counter = CachingCounter(Chars4Counter())
    as_string = counter.count_message(user("hello there"))
    as_block = counter.count_message(user(text("hello there")))
    assert abs(as_string - as_block) <= 2


def _corpus_histories() -> list[str]:
    return sorted(p.name for p in CORPUS.glob("*.json") if p.name != "manifest.json")


@pytest.mark.parametrize("name", _corpus_histories()[::12])
def test_estimate_tokens_stays_within_a_few_tokens_of_the_seeds_estimate(name: str) -> None:
    """Without a counter, estimate_tokens is the seed's ``len(json.dumps(messages)) // 4``
    (within 1% or 8 tokens, whichever is larger) over real agent histories."""
    messages = json.loads((CORPUS / name).read_text(encoding="utf-8"))["messages"]
    seed = len(json.dumps(messages)) // 4
    assert abs(estimate_tokens(messages) - seed) <= max(8, seed // 100)


def test_estimate_tokens_with_a_counter_is_that_counters_count() -> None:
    """Given a counter, estimate_tokens counts content and framing as the thresholds do."""
    messages = long_session(5)
    counter = CachingCounter(Chars4Counter())
    expected = sum(counter.count_message(m) for m in messages)
    assert estimate_tokens(messages, Chars4Counter()) == expected
    assert estimate_tokens(messages, CachingCounter(Chars4Counter())) == expected


class _RecordingTiktoken(TiktokenCounter):
    """The real counter, noting which texts it counted one by one and in batches."""

    def __init__(self) -> None:
        super().__init__()
        self.single: list[int] = []
        self.batches: list[int] = []

    def count_text(self, text: str) -> int:
        self.single.append(len(text))
        return super().count_text(text)

    def count_texts(self, texts: list[str]) -> list[int]:
        self.batches.append(len(texts))
        return super().count_texts(texts)


def test_count_texts_counts_long_new_texts_in_one_parallel_batch() -> None:
    """The same counts as one by one; the long texts not cached yet go through one batch (a
    summary transcript's messages as JSON), the short ones and the cached ones do not."""
    texts = [json.dumps({"role": "user", "content": f"result {n} " + "word " * 12_000})
             for n in range(8)] + ["short one", "another short text"]
    base = _RecordingTiktoken()
    counter = CachingCounter(base)
    counts = counter.count_texts(texts)
    assert counts == [TiktokenCounter().count_text(t) for t in texts]
    assert base.batches == [8]
    assert all(size < 8 * 1024 for size in base.single)  # only the short ones one by one
    base.single.clear()
    assert counter.count_texts(texts[:8]) == counts[:8]  # cached now: nothing counted again
    assert base.batches == [8] and base.single == []


def test_prefetch_counts_a_cold_historys_long_texts_in_one_batch() -> None:
    """A cold history's large tool results: one parallel batch, then every message's count
    comes from the cache."""
    messages = [user(tool_result(f"t{n}", f"line {n} of output\n" * 2_000)) for n in range(12)]
    base = _RecordingTiktoken()
    counter = CachingCounter(base)
    counter.prefetch(messages, [fingerprint(m) for m in messages])
    assert base.batches == [12]
    single_before = len(base.single)
    totals = [counter.count_message(m) for m in messages]
    assert all(size < 8 * 1024 for size in base.single[single_before:])
    assert totals == [CachingCounter(TiktokenCounter()).count_message(m) for m in messages]


def test_a_staged_counter_reads_the_shared_counts_and_adds_its_own_only_when_committed(
) -> None:
    shared = CachingCounter(Chars4Counter())
    known = user("known " * 50)
    shared.count_message(known)
    staged = shared.staged()
    assert staged.count_message(known) == shared.count_message(known)
    assert staged.misses == 0  # read from the shared counts
    fresh = user("fresh " * 50)
    tokens = staged.count_message(fresh)
    assert staged.misses == 1 and len(shared) == 1  # counted, not kept yet
    staged.commit()
    assert len(shared) == 2
    before = shared.misses
    assert shared.count_message(fresh) == tokens and shared.misses == before  # a hit now
