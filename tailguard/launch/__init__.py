"""`tailguard up`: what it starts and where. The orchestration layer above the parts.

Owns the one list of a deployment's processes that every way of running it follows
(``processes``, pure), the placement of workers on devices (``worker_placement``, pure) and
the supervisor that starts, watches and stops every process (``supervisor``).
May import: ``tailguard.host``, ``tailguard.lanes``, ``tailguard.model``,
``tailguard.redis``, ``errors``, ``settings``.
"""
