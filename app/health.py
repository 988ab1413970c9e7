"""The API's probes and the fleet's health, the lane table, the metrics.

Three questions, three routes (Kubernetes' own: /livez, /readyz, and a health page for people
and alerts): /livez, the process answers; /readyz, it can take and answer requests (Redis
answers); /healthz, the fleet (which lanes have no live worker, Redis's room). A fleet scaled
to zero workers, or a lane emptied by design, leaves the API ready: it answers its own 429
and 503 (no_live_worker, storage_full) to each request.
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.gateway_ext import get_gateway

bp = Blueprint("health", __name__)


@bp.get("/livez")
def livez():
    """The API process answers: a liveness probe. Nothing else is asked (not even Redis).
    ---
    get:
      summary: Liveness
      responses:
        200: {description: the process answers, content: {application/json: {schema: Probe}}}
    """
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz():
    """Ready when Redis (the broker and the job store) answers: a readiness probe. Workers
    and lanes are not asked: without them the API still answers each request itself.
    ---
    get:
      summary: Readiness
      responses:
        200: {description: Redis answers, content: {application/json: {schema: Probe}}}
        503: {description: Redis does not answer, content: {application/json: {schema: Probe}}}
    """
    ready, body = get_gateway().readiness()
    return jsonify(body), 200 if ready else 503


@bp.get("/healthz")
def healthz():
    """Healthy when Redis answers and has room for new jobs, and every lane has a live worker:
    the fleet, for alerts and people (the probes are /livez and /readyz).
    ---
    get:
      summary: Fleet health
      responses:
        200: {description: every lane served, content: {application/json: {schema: Health}}}
        503: {description: a lane without a live worker, or Redis past its high-water mark
              (storage.full), content: {application/json: {schema: Health}}}
    """
    healthy, body = get_gateway().health()
    return jsonify(body), 200 if healthy else 503


@bp.get("/v1/lanes")
def lanes():
    """The lane table and the workers serving it.
    ---
    get:
      summary: Lanes
      responses:
        200: {description: lanes and workers, content: {application/json: {schema: Lanes}}}
    """
    return jsonify(get_gateway().lanes_view())


@bp.get("/metrics")
def metrics():
    """Prometheus text: per-lane histograms and counters, queue depth (see tailguard/observe/metrics.py).
    ---
    get:
      summary: Prometheus metrics
      responses:
        200: {description: Prometheus text format, content: {text/plain: {schema: {type: string}}}}
    """
    return Response(generate_latest(get_gateway().metrics.registry), mimetype=CONTENT_TYPE_LATEST)
