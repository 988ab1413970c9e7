"""`tailguard conformance`: the same OpenAI requests against `vllm serve` and tailguard, compared.

Not a load: 94 checks, each a few HTTP calls and a predicate on the answers, sent one at a
time with the official ``openai`` SDK to vLLM's own OpenAI server and then to tailguard's
lanes on the same model and cores; tailguard must pass what vLLM passes but its documented
refusals, fail no job after queueing, and give the SDK nothing to retry.

Parts, one per file: ``check`` (what a check is, placeholders, how one side is judged,
pure), ``catalog`` (the checks, pure), ``compare`` (the two sides compared, the targets and
the text report, pure), ``sender`` (the SDK, every request counted), ``run`` (both servers
up one after the other, the checks sent, the report written). The pure parts import
without Redis, vLLM or the SDK.

A tool: only the CLI imports it. May import: ``tailguard.bench`` (its ``direct`` and ``lanes``
topologies bring both servers up), ``tailguard.gateway`` (the refusals it documents),
``tailguard.host``, ``tailguard.lanes``, ``tailguard.model``, ``errors``, ``settings``.
"""
