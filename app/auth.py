"""Who is calling: the authentication hook of every request, and the per-key wait slots."""

from __future__ import annotations

from typing import Any

from flask import Flask, Response, after_this_request, g, request

from app.gateway_ext import get_gateway
from tailguard import settings
from tailguard.errors import Unauthenticated
from tailguard.gateway.api_keys import LOOPBACK_HOSTS, is_loopback
from tailguard.settings import AUTH_KEYS, AUTH_OPEN

#: vLLM's routes outside /v1 that spend the API's CPU on a client's text: a key's, as /v1's
KEYED_SERVER_PATHS = frozenset({"/tokenize", "/detokenize"})


def needs_api_key(path: str) -> bool:
    """Whether a request to ``path`` must carry an API key (in keys mode): every /v1/ route,
    and vLLM's /tokenize and /detokenize (vLLM's own server asks none there)."""
    return path.startswith("/v1/") or path in KEYED_SERVER_PATHS


def init_app(app: Flask) -> None:
    """Authenticate every request before its view runs (the mode from app.config)."""
    auth, open_remote = _auth_config(app.config)

    @app.before_request
    def _authenticate() -> None:
        """Keys mode: every /v1/ route needs an API key (/healthz and /metrics never do), and
        each call is charged to its key's requests per minute before anything else is done
        for it. Open mode: no key, and only clients on this machine unless TAILGUARD_API_OPEN."""
        if auth == AUTH_OPEN:
            # no peer address: a Unix socket (or an in-process client), this machine's alone
            peer = request.remote_addr
            if not open_remote and peer and not is_loopback(peer):
                raise Unauthenticated(f"this API runs without API keys ({settings.API_AUTH.env}=open) "
                                      "and serves clients on its own machine only")
            return
        if needs_api_key(request.path):
            gw = get_gateway()
            g.api_key = gw.api_keys.authenticate(request.headers.get("Authorization"))
            gw.charge_call(g.api_key)


def _auth_config(config: dict[str, Any]) -> tuple[str, bool]:
    """The app's authentication mode (TAILGUARD_API_AUTH; keys unless set: `tailguard api`
    resolves the default from its bind and sets it), whether open mode serves remote clients
    (TAILGUARD_API_OPEN), and the Host headers it answers, put in Flask's TRUSTED_HOSTS
    (a 400 for any other: DNS rebinding)."""
    auth = settings.API_AUTH.get(config) or AUTH_KEYS
    config[settings.API_AUTH.env] = auth
    open_remote = settings.API_OPEN.get(config)
    hosts = [h.strip() for h in settings.API_TRUSTED_HOSTS.get(config).split(",") if h.strip()]
    if not hosts and auth == AUTH_OPEN and not open_remote:
        hosts = list(LOOPBACK_HOSTS)
    config["TRUSTED_HOSTS"] = hosts or None
    return auth, open_remote


def hold_wait_slot() -> None:
    """Hold one of the caller's key's wait slots (TAILGUARD_MAX_WAITS_PER_KEY) until this
    request's response is closed, a stream's when it ends or its client goes away; a 429
    when the key holds them all. Called first by every view that may wait."""
    release = get_gateway().hold_wait(g.get("api_key"))

    @after_this_request
    def _release_when_closed(response: Response) -> Response:
        response.call_on_close(release)
        return response
