"""compactor — the compaction engine of compact-proxy, as a pure library (no network).

Pure functions over a Messages API ``messages`` view, the durable context state, the
source-pointer resolver (the only part that reads files) and the renderer: the names of SPEC
section 7, plus the async driver the proxy uses. Guide: docs/library.md.
"""

from policies._session_ids import (
    MAX_SESSION_ID_CHARS,
    SESSION_ID_PATTERN,
    SESSION_ID_RULE,
    check_session_id,
    is_session_id,
    session_id_problem,
)

from ._errors import MessageShapeError, MessageViewLimitExceeded, ToolProtocolError
from ._facts import MessageFact, message_fact, message_facts
from ._pipeline import (
    CompactionCheckpoint,
    CompactionOptions,
    CompactionResult,
    LayerOutcome,
    SummaryRequest,
    compact_context,
    compact_context_async,
    compact_if_needed,
    summary_cache_key,
    summary_view,
)
from ._pointers import ArtifactPointer, SourcePointer, TranscriptPointer, parse_source_pointer
from ._prepared import PREPARED_DETAIL, PreparedSpan, prefix_print, prepare_span, prepared_request
from ._protocol import Interaction, ProtocolMemo, StagedMemo, validate_tool_protocol
from ._render import append_to_system, render_durable_context
from ._resolver import (
    SourceExcerpt,
    SourcePointerResolver,
    SourceResolution,
    resolve_durable_sources,
)
from ._state import DurableContextState, capture_retrieval_evidence
from ._state_items import (
    PENDING_STATUSES,
    DurableFact,
    PendingItem,
    PendingStatus,
    RetrievalEvidence,
)
from ._tokens import (
    CachingCounter,
    Chars4Counter,
    StagedCounter,
    TiktokenCounter,
    TokenCounter,
    estimate_tokens,
)

__all__ = ["PREPARED_DETAIL", "PreparedSpan", "prefix_print", "prepare_span", "prepared_request",
           "ArtifactPointer", "CachingCounter", "Chars4Counter", "CompactionCheckpoint",
           "CompactionOptions", "CompactionResult", "DurableContextState", "DurableFact",
           "Interaction", "LayerOutcome", "MAX_SESSION_ID_CHARS", "MessageFact",
           "MessageShapeError", "MessageViewLimitExceeded", "PENDING_STATUSES", "PendingItem",
           "PendingStatus", "ProtocolMemo", "RetrievalEvidence", "SESSION_ID_PATTERN",
           "SESSION_ID_RULE", "SourceExcerpt", "SourcePointer", "SourcePointerResolver",
           "SourceResolution", "StagedCounter", "StagedMemo", "SummaryRequest", "TiktokenCounter",
           "TokenCounter", "ToolProtocolError", "TranscriptPointer", "append_to_system",
           "capture_retrieval_evidence", "check_session_id", "compact_context",
           "compact_context_async", "compact_if_needed", "estimate_tokens", "is_session_id",
           "message_fact", "message_facts", "parse_source_pointer", "render_durable_context",
           "resolve_durable_sources", "summary_cache_key", "summary_view", "session_id_problem",
           "validate_tool_protocol"]
