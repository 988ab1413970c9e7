"""`tailguard bench`: the P99 explosion, reproduced, and lanes fixing it, on real engines.

One run brings up each topology on the same cores with the same model, one after
another, and drives it with the same open-loop (Poisson) load:

* ``shared``: every worker consumes one common queue, first come first served;
* ``lanes``:  workers split by lane, as the lanes file in force says;
* ``direct``: no tailguard: vLLM's own OpenAI server on all those cores, each class sent
  with a vLLM priority (what a user would run instead).
* ``fleet``: no tailguard: a tuned vLLM server per engine behind vLLM's own router
  (``vllm-router``), what users deploy on the same hardware.

Each topology sees two phases with the same short-request arrivals: ``baseline``
(the short class alone) and ``mixed`` (short and long together), so the report
can say how much long traffic hurts short requests in each.

Parts, one per file: ``workload`` (what to send, pure; its prompts and seeded arrivals
are ``tailguard.plan.synthetic``'s), ``sessions`` (the chat and shared-doc workloads, whose
requests share prefixes, pure), ``azure_trace`` (the Azure LLM inference traces
2023 as workloads; the files, CC BY 4.0, with their licence and attribution in
``traces/``), ``loadgen`` (sending it and timing each streamed request), ``topology``
(bringing one system up and down), ``fleet`` (the router fleet's specs and processes),
``engine_watch`` (each engine's running requests, read from its own vLLM series),
``comparison`` (per class against the peers, pure), ``report`` (statistics, ratios, PASS/FAIL lines,
pure), ``goodput`` (requests within their class's SLO, as vLLM's ``bench serve
--goodput``, pure), ``host``, ``stall_watch`` and ``redis_watch`` (what the machine, its
other processes and Redis did meanwhile), ``plot`` (the PNG), ``run`` (the whole
benchmark). The pure parts import without Redis or vLLM. The OpenAI conformance suite
is ``tailguard.conformance`` (``tailguard bench --workload compat`` is its deprecated
spelling, which the CLI redirects).

A tool: only the CLI imports it (and ``tailguard.conformance``, whose servers are its
``direct`` and ``lanes`` topologies). May import every package of the product and
``tailguard.plan``, never ``tailguard.conformance``.
"""
