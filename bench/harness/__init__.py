"""What every benchmark under ``bench/`` shares, one module per concern.

- ``config``: the model and key sent, timeouts, work sizes, compaction thresholds, and the
  config files written for a benchmark proxy (``write_proxy_config``) and for LiteLLM;
- ``workloads``: the coding agent's session, histories of a size, request bodies and headers;
- ``processes``: child processes (``ManagedProcess``), free ports, the fake provider, the proxy,
  LiteLLM, a baseline commit's worktree;
- ``relay``: the reference relay (a bare aiohttp reverse proxy), the floor of any Python hop;
- ``client``: one request sent and timed (``send`` → ``Sample``);
- ``stats``: percentiles, CPU and RSS read from ``/proc``, table cells.
"""
