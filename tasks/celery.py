"""Builds the Celery app from celeryconfig.py."""

from celery import Celery

app = Celery("tailguard", include=["tasks.generate", "tasks.worker"])
app.config_from_object("celeryconfig")
