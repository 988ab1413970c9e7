"""`tailguard plan`: how many engines each lane needs, by simulation.

Pure Python, no Redis and no engine: a discrete-event simulation of the lanes
(placement by cost, caps, queue TTL, deadlines) and of engines doing continuous
batching, whose step time comes from a short profile of the real engine.

* ``stepmodel``: the engine's step time as a function of the batch, fitted from a profile;
* ``profile``: the profile itself, a short sweep on a real vLLM engine (the one impure part);
* ``workload``: per-class arrival rates and length distributions (flags, a trace, stats JSON);
* ``sim``: the simulator;
* ``search``: the fewest engines per lane group that meet the targets.
"""
