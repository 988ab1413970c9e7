"""The lane controller: one decision-maker per deployment that moves warm workers between lanes.

Owns the controller loop (``controller``: a Redis lease, so any process may run it and one
does; each tick reads the lanes' load and the workers' reports and writes orders). The
policy it applies is pure and lives in ``tailguard.lanes.rebalance``; the orders' Redis
state in ``tailguard.jobs.lane_orders``; workers carry them out
(``tailguard.worker.lane_follower``).
May import: ``tailguard.jobs``, ``tailguard.lanes``, ``tailguard.redis``, ``errors``,
``settings``.
"""
