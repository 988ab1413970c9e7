"""Lanes: the policy of the queues requests are split into. Pure: no I/O, no Redis, no engine.

Owns the lane table and its file (``table``, ``lanes.toml``), the file's vLLM engine
tables and their checks (``engine_options``: vLLM's EngineArgs are passed in, never
imported), where a request goes and what it may ask for (``placement``), whether a lane
takes it now (``admission``), the order and share of each API key in a lane (``fair_share``),
what a request's latency targets may be and decide (``latency_targets``) and the order in
which an engine takes work from the lanes it serves, within each one's per-engine limit
(``dispatch``), and which engine a request whose prefix an engine holds is offered to first
(``affinity``).
May import: ``tailguard.errors``, ``tailguard.settings``.
"""
