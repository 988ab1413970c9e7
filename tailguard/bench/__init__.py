"""`tailguard bench`: the P99 explosion, reproduced, and lanes fixing it, on real engines.

One run brings up each topology on the same cores with the same model and the
same number of engines, one after another, and drives it with the same open-loop
(Poisson) load:

* ``shared``: every worker consumes one common queue, first come first served;
* ``lanes``:  workers split by lane, as the lanes file in force says.

Each topology sees two phases with the same short-request arrivals: ``baseline``
(the short class alone) and ``mixed`` (short and long together), so the report
can say how much long traffic hurts short requests in each.

Parts, one per file: ``workload`` (what to send, pure), ``azure_trace`` (the
Azure LLM inference traces 2023 as workloads; the files, CC BY 4.0, with their
licence and attribution in ``traces/``), ``loadgen`` (sending it and timing each
streamed request), ``topology`` (bringing one system up and down), ``report``
(statistics, ratios, PASS/FAIL lines, pure), ``goodput`` (requests within their
class's SLO, as vLLM's ``bench serve --goodput``, pure), ``plot`` (the PNG),
``run`` (the whole benchmark). The pure parts import without Redis or vLLM.
"""
