"""The machine: cores, devices, processes, and the servers tailguard runs itself.

Owns the core plan (``cores``), /proc and CPU priorities (``procfs``), accelerators
(``devices``), child processes (``procs``), the engine-core roamer (``roaming``), the
embedded redis-server (``redis_server``) and the secrets kept on disk (``secrets``).
Knows nothing of lanes, jobs or engines.
May import: ``errors``, ``settings``.
"""
