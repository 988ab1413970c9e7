"""The Celery app of tailguard: `celery -A tasks worker -Q short` serves the short lane.

Importing this package builds the app and nothing else: the task bodies and the
engine live in modules the worker imports (`include`), so the API can import
`tasks` to publish without pulling in vLLM or torch.
"""

from tasks import worker  # noqa: F401 - registers `celery -A tasks inspect engine_stats`
from tasks.celery import app

__all__ = ["app"]
