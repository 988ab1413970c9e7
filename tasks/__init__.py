"""The Celery app of tailguard: `celery -A tasks worker -Q short` serves the short lane.

Importing this package builds the app and nothing else: the task bodies and the
engine live in modules the worker imports (`include`), so `celery -A tasks inspect`
and Flower pull in no vLLM or torch. The API never imports it: it queues a job's
Celery message itself, in the Redis call that stores the record
(tailguard/jobs/task_message.py).
"""

from tasks import worker  # noqa: F401 - registers `celery -A tasks inspect engine_stats`
from tasks.celery import app

__all__ = ["app"]
