"""The request path, in the order a request meets it.

:mod:`~proxy.http.routes` (which path goes where) → :mod:`~proxy.http.audit` (the request's
audit record and its closing log line) → :mod:`~proxy.http.errors` (every failure as an
Anthropic-shaped answer) → :mod:`~proxy.http.handlers` (read and decode the body
(:mod:`~proxy.http.body`), resolve the session (:mod:`~proxy.http.session`), compact, append
the durable context, the thinking-binding opt-out (:mod:`~proxy.http.thinking`)) →
:mod:`~proxy.http.forward` (to the provider, and the answer relayed event by event).
"""
