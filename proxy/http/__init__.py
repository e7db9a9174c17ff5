"""The request path: :mod:`~proxy.http.routes` -> :mod:`~proxy.http.audit` (record, log line)
-> :mod:`~proxy.http.errors` -> :mod:`~proxy.http.handlers` (body, session, compaction, durable
context, thinking opt-out) -> :mod:`~proxy.http.forward` (to the provider and back)."""
