"""The client's own credentials, as a summary call made for it sends them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.summary.client import sdk

if TYPE_CHECKING:
    import anthropic

__all__ = ["CallerCredentials"]


@dataclass(frozen=True)
class CallerCredentials:
    """The client's own ``x-api-key`` and ``Authorization`` headers, if sent: its summary
    calls send them as they are."""

    x_api_key: str | None = None
    authorization: str | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> CallerCredentials:
        """Pick the auth headers out of a request's headers."""
        return cls(x_api_key=headers.get("x-api-key") or None,
                   authorization=headers.get("Authorization") or None)

    @property
    def present(self) -> bool:
        """Whether the client sent any credential."""
        return self.x_api_key is not None or self.authorization is not None

    def as_extra_headers(self) -> dict[str, str | anthropic.Omit]:
        """Per-call SDK headers: exactly the caller's, the client's own credential omitted."""
        omit = sdk().omit
        return {
            "X-Api-Key": self.x_api_key if self.x_api_key is not None else omit,
            "Authorization": self.authorization if self.authorization is not None else omit,
        }
