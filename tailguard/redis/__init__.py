"""tailguard's own Redis plumbing: clients, key names, Lua scripts.

Owns building clients from the configured URL (``client``), every Redis key name
(``keys``) and the Lua scripts with their loader (``lua/``).
May import: ``errors``, ``settings``.
"""
