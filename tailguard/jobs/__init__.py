"""Jobs and workers as Redis holds them: the state every process shares.

Owns the job record and its state machine (``store``), a job's output stream
(``stream``), each lane's load (``lane_load``), the stream of finished jobs
(``finished``), worker heartbeats (``liveness``), the reaping of dead workers' jobs
(``reaper``), the redelivery of lost messages (``redeliver``), the Celery message a
job is queued with (``task_message``), Redis's room for new jobs (``redis_memory``), and
prefix affinity's index of who served which prompt prefix and its offers (``prefix_index``).
No engine, no Flask.
May import: ``tailguard.redis``, ``tailguard.lanes``, ``errors``, ``settings``.
"""
