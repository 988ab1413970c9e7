"""tailguard: lanes of Celery queues in front of vLLM engines, for low tail latency."""
