"""The API's domain logic, free of Flask: accept a request, place it, report on it.

Owns the gateway service (``service``), native request validation (``job_request``), what
tailguard adds to an OpenAI request (``openai_request``: its class, refused and ignored
fields, the lane's grant, the task's ``openai`` argument), vLLM's own OpenAI frontend in
this process (``openai_frontend``: request models and render layer, no engine), API keys
(``api_keys``) and wait slots (``wait_slots``). ``app/`` is a thin Flask skin over it.
May import: ``tailguard.jobs``, ``tailguard.lanes``, ``tailguard.model``,
``tailguard.observe``, ``tailguard.redis``, ``errors``, ``settings``, ``sampling``,
``loop_thread``, ``openai_args``; never the engine or the worker; vLLM's frontend from
``openai_frontend`` only, never an engine of vLLM's.
"""
