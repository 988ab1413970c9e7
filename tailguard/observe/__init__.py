"""What operators read: Prometheus metrics, `tailguard stats`, and the sketch behind them.

Owns the metric families (``metrics``), vLLM's own series on a worker's port labelled with
its worker and lanes (``vllm_series``), the per-minute histograms in Redis and their
report (``stats``) and the mergeable log-bucket histogram (``sketch``).
May import: ``tailguard.jobs``, ``tailguard.lanes``, ``tailguard.engine`` (its stats
record only), ``tailguard.redis``, ``errors``, ``settings``.
"""
