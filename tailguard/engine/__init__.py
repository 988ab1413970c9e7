"""One vLLM engine in a process, driven from many threads. No Redis, no Celery.

Owns the engine host (``host``: one AsyncLLM on its own event loop, a
``tailguard.loop_thread.LoopThread``), the bridge from a caller's thread to one request on
that loop (``bridge``), what the host observed (``stats``), keeping it serving across deaths
(``keeper``), the warm-up it must pass before it serves (``warmup``) and vLLM's own OpenAI
serving layer on it (``serving``).
May import: ``tailguard.host``, ``tailguard.model``, ``errors``, ``settings``, ``sampling``,
``loop_thread``, ``openai_args``.
"""
