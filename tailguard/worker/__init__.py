"""One worker process: its runtime, the jobs it runs, the lanes it takes them from.

Owns the worker runtime (``runtime``: engine, heartbeat, lane gate, built when the
Celery consumer is ready, its parts started and stopped in a declared order; no other
module here imports it), its engine configuration (``engine_config``), the heartbeat
(``heartbeat``), its liveness for an orchestrator's probe (``probe``), the lifecycle of a
job on the worker (``runner``) and the per-engine limits of the lanes it consumes
(``lane_gate``). ``tasks/`` adapts Celery's signals and tasks to it.
May import: ``tailguard.engine``, ``tailguard.jobs``, ``tailguard.lanes``,
``tailguard.model``, ``tailguard.observe``, ``tailguard.host``, ``tailguard.redis``,
``errors``, ``settings``, ``sampling``.
"""
