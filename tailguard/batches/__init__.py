"""The OpenAI Batch API: files, batches, and the feeder that runs a batch's lines as jobs.

Owns the line formats and the input file's validation (``lines``: pure), the public objects
(``objects``: pure: file and batch as OpenAI shapes them, statuses, pagination), where file
contents live (``contents``: a local directory or an fsspec URL), file and batch metadata in
Redis (``store``), what the API's views ask (``service``) and the feeder (``feeder``: a
thread in each API process, one at a time holding a Redis lease, that queues a bounded number
of each batch's lines on the batch lane through the gateway's one submit path and writes the
output and error files), and its figures in /metrics (``metrics``).
May import: ``tailguard.gateway``, ``tailguard.jobs``, ``tailguard.observe``, ``tailguard.redis``,
``errors``, ``settings``.
"""
