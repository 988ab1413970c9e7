"""Liveness of the whole system and the lane table."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app import get_gateway
from tailguard.jobs.liveness import Liveness, lane_health

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
    gw = get_gateway()
    healthy, body = lane_health(Liveness(gw.store.redis), gw.lanes.names)
    memory = gw.store.storage.memory()
    body["storage"] = memory.to_dict()
    if memory.full:
        healthy, body["status"] = False, "degraded"
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
    gw = get_gateway()
    per_host = Liveness(gw.store.redis).live_workers_per_host(gw.lanes.names)
    return jsonify({"model": gw.counter.model if hasattr(gw.counter, "model") else None,
                    "model_max_len": gw.counter.model_max_len,
                    "lanes": [{**lane.to_dict(), "live_workers_per_host": per_host[lane.name]}
                              for lane in gw.lanes],
                    "workers": [{"name": w.name, "lanes": list(w.lanes)} for w in gw.lanes.workers]})


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
