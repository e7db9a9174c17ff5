"""Compaction thresholds and the file-read tool list, per deployment.

Everything in ``__all__`` gets re-exported by ``policies/__init__.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CompactionPolicy", "ReadToolSpec", "DEFAULT_READ_TOOLS"]


@dataclass(frozen=True)
class ReadToolSpec:
    """How to recognise a file read from a ``tool_use`` block.

    A ``tool_use`` whose ``name`` equals :attr:`name` (and, when :attr:`command` is set,
    whose ``input["command"]`` equals it) reads the file named by ``input[path_field]``.
    The fields named in :attr:`range_fields` (e.g. ``offset``/``limit``) make a different
    read: two reads supersede each other only when path and range are equal.
    """

    name: str
    path_field: str
    range_fields: tuple[str, ...] = ()
    command: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("ReadToolSpec.name must not be empty")
        if not self.path_field:
            raise ValueError("ReadToolSpec.path_field must not be empty")
        object.__setattr__(self, "range_fields", tuple(self.range_fields))


DEFAULT_READ_TOOLS: tuple[ReadToolSpec, ...] = (
    # Claude Code's Read tool.
    ReadToolSpec("Read", "file_path", ("offset", "limit")),
    # Anthropic's text-editor tool (text_editor_2025xxxx), whose name is fixed by the API.
    ReadToolSpec("str_replace_based_edit_tool", "path", ("view_range",), command="view"),
    ReadToolSpec("str_replace_editor", "path", ("view_range",), command="view"),
    # Generic agents.
    ReadToolSpec("read_file", "path", ("offset", "limit", "start_line", "end_line")),
)


@dataclass(frozen=True)
class CompactionPolicy:
    """The thresholds one role compacts with; names follow the ``compaction`` config keys.

    Args:
        soft_threshold_tokens: compaction starts at or above this many tokens and stops as
            soon as the view is below it.
        hard_limit_tokens: a view still at or above this after every layer is rejected.
        max_tool_result_tokens: L1 truncates tool results larger than this.
        keep_recent_messages: L3 keeps this many most recent messages verbatim.
        summary_keep_recent: L4 keeps this many most recent messages verbatim.
        read_tools: the tools L2 recognises as file reads.
        summary_enabled: whether L4 may run at all.
        compact_to_ratio: in sticky mode a compaction, once started, goes on until the view
            is below ``soft_threshold_tokens × compact_to_ratio``, so the next crossing (and
            the next cache miss) is far away — the provider's "clear at least" idea.
    """

    soft_threshold_tokens: int = 80_000
    hard_limit_tokens: int = 120_000
    max_tool_result_tokens: int = 5_000
    keep_recent_messages: int = 6
    summary_keep_recent: int = 4
    read_tools: tuple[ReadToolSpec, ...] = field(default=DEFAULT_READ_TOOLS)
    summary_enabled: bool = True
    compact_to_ratio: float = 0.7

    def __post_init__(self) -> None:
        for name in ("soft_threshold_tokens", "hard_limit_tokens", "max_tool_result_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("keep_recent_messages", "summary_keep_recent"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if self.soft_threshold_tokens >= self.hard_limit_tokens:
            raise ValueError(
                "soft_threshold_tokens must be below hard_limit_tokens "
                f"({self.soft_threshold_tokens} >= {self.hard_limit_tokens})"
            )
        ratio = self.compact_to_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ValueError(f"compact_to_ratio must be in (0, 1], got {ratio!r}")
        object.__setattr__(self, "read_tools", tuple(self.read_tools))
