"""compactor — the compaction engine of compact-proxy, as a pure library.

No aiohttp, no network: pure functions over a Messages API ``messages`` view, the durable
context state types, the source-pointer resolver (the only part that reads files) and the
renderer. The public names are those of SPEC section 7, plus the async pipeline driver the
proxy uses.
"""

from ._errors import MessageViewLimitExceeded, ToolProtocolError
from ._pipeline import (
    CompactionCheckpoint,
    CompactionResult,
    LayerOutcome,
    SummaryRequest,
    compact_context,
    compact_context_async,
    compact_if_needed,
)
from ._pointers import (
    ArtifactPointer,
    SourcePointer,
    TranscriptPointer,
    parse_source_pointer,
)
from ._protocol import Interaction, validate_tool_protocol
from ._render import append_to_system, render_durable_context
from ._resolver import SourcePointerResolver, SourceResolution, resolve_durable_sources
from ._state import (
    DurableContextState,
    DurableFact,
    PendingItem,
    RetrievalEvidence,
    capture_retrieval_evidence,
)
from ._tokens import CachingCounter, Chars4Counter, TiktokenCounter, TokenCounter, estimate_tokens

__all__ = [
    "ArtifactPointer",
    "CachingCounter",
    "Chars4Counter",
    "CompactionCheckpoint",
    "CompactionResult",
    "DurableContextState",
    "DurableFact",
    "Interaction",
    "LayerOutcome",
    "MessageViewLimitExceeded",
    "PendingItem",
    "RetrievalEvidence",
    "SourcePointer",
    "SourcePointerResolver",
    "SourceResolution",
    "SummaryRequest",
    "TiktokenCounter",
    "TokenCounter",
    "ToolProtocolError",
    "TranscriptPointer",
    "append_to_system",
    "capture_retrieval_evidence",
    "compact_context",
    "compact_context_async",
    "compact_if_needed",
    "estimate_tokens",
    "parse_source_pointer",
    "render_durable_context",
    "resolve_durable_sources",
    "validate_tool_protocol",
]
