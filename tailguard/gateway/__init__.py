"""The API's domain logic, free of Flask: accept a request, place it, report on it.

Owns the gateway service (``service``), request validation (``job_request``), the
OpenAI protocol's bodies (``openai_protocol``) and API keys (``api_keys``). ``app/`` is
a thin Flask skin over it.
May import: ``tailguard.jobs``, ``tailguard.lanes``, ``tailguard.model``,
``tailguard.observe``, ``tailguard.redis``, ``errors``, ``settings``, ``sampling``; never
the engine, the worker or vLLM.
"""
