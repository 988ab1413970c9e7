"""Liveness of the whole system and the lane table."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.gateway_ext import get_gateway

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    """Healthy when Redis answers and has room for new jobs, and every lane has a live worker.
    ---
    get:
      summary: Liveness
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
