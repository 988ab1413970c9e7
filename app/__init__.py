"""The tailguard REST API (Flask app factory; served by gunicorn: `gunicorn 'app:create_app()'`).

The composition root only composes: settings into app.config (``config``), the one error
mapping (``errors``), the Gateway as an extension (``gateway_ext``: built on first use,
started by gunicorn's post_worker_init hook), authentication (``auth``), then the blueprints.
Blueprints import what they need from those modules, never from this package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import Flask


def create_app(test_config: Mapping[str, Any] | None = None) -> Flask:
    """Build the API. Nothing connects, loads or starts here: the gateway is built on first
    use, and the process's background threads start with `app.gateway_ext.start_gateway`.
    `test_config` overrides any setting (app/config.py)."""
    from app import auth, batches, config, errors, gateway_ext, health, jobs, openai_api, openapi

    app = Flask(__name__)
    config.init_app(app, test_config)
    app.json.ensure_ascii = False  # Chinese prompts and text stay readable
    gateway_ext.init_app(app)
    errors.register(app)
    auth.init_app(app)
    for blueprint in (jobs.bp, openai_api.bp, openai_api.server_bp, batches.bp, health.bp,
                      openapi.bp):
        app.register_blueprint(blueprint)
    return app
