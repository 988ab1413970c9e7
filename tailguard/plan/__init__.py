"""`tailguard plan`: how many engines each lane needs, by simulation.

Pure Python, no Redis and no engine: a discrete-event simulation of the lanes
(placement by cost, caps, queue TTL, deadlines) and of engines doing continuous
batching, whose step time comes from a short profile of the real engine.

* ``stepmodel``: the engine's step time as a function of the batch, fitted from a profile;
* ``profile``: the profile itself, a short sweep on a real vLLM engine (the one impure part);
* ``workload``: per-class arrival rates and length distributions (flags, a trace, stats JSON);
* ``sim``: the simulator: dedicated lanes, tailguard's fleet (a central queue per lane, the
  workers' own dispatch rule, tailguard/lanes/dispatch.py) or a router's replicas;
* ``azure``: a window of the Azure trace the bench replays, as arrivals;
* ``compare``: tailguard's fleet, one shared engine per GPU, a router fleet and static lanes,
  per fleet size (``--compare-fleet``);
* ``prefix_cache``: an engine's prefix cache, an LRU of named prefixes bounded in tokens;
* ``prefix``: the prefix cache at fleet scale, any free engine against prefix affinity, on the
  chat and shared-doc workloads (``--prefix-cache``);
* ``keda``: the engines the fleet needs per load and an autoscaler's threshold (``--keda``);
* ``search``: the fewest engines per lane group that meet the targets;
* ``synthetic``: the requests both tools make (prompts of a length, seeded Poisson arrivals);
  ``tailguard bench`` builds its workloads on it;
* ``validate``: the simulator against the bench runs of docs/benchmarks.md.

A tool: only the CLI imports it, and the bench (its arrivals, prompts, the shared topology's
lane, the nearest-rank percentile both report). May import: ``tailguard.host``,
``tailguard.lanes``, ``tailguard.model``, ``tailguard.engine``, ``errors``, ``settings``;
never the bench, whose runs it replays.
"""
