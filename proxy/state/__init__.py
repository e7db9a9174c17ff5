"""What the proxy keeps between requests: the session store (durable state, summaries,
records; SQLite or Redis), sticky checkpoints per conversation lane, the source-pointer
resolvers per session, and the L4 summariser with its cache."""
