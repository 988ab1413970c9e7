"""The official ``openai`` SDK against one server, every request counted.

Every SDK request goes through an httpx event hook that counts it, its retries (the SDK's own
``x-stainless-retry-count`` header) and the answers a default-retrying SDK would retry (the
SDK's ``_should_retry``). The SDK is imported when a ``Sender`` is made: the checks and their
comparison import without it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from tailguard.conformance.check import Answer, Call, Context, fill, fill_text

#: how long one call may take (an omitted max_tokens on vLLM's chat runs to a stop)
CALL_TIMEOUT_S = 300.0


class Sender:
    """The official SDK against one server, every request counted by an httpx event hook."""

    def __init__(self, url: str, api_key: str = "unused", timeout_s: float = CALL_TIMEOUT_S,
                 metrics_urls: Sequence[str] = ()) -> None:
        """`metrics_urls`: where the server's engines' Prometheus series are (the ``metrics``
        route); none given: the server's own /metrics, as `vllm serve` has them."""
        import openai

        self.url = url.rstrip("/")
        self.metrics_urls = list(metrics_urls) or [self.url + "/metrics"]
        self.http = openai.DefaultHttpx2Client(
            timeout=timeout_s, event_hooks={"request": [self._on_request],
                                            "response": [self._on_response]})
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0,
                                    timeout=timeout_s, http_client=self.http)
        self.requests = self.retries = self.would_retry = 0

    def _on_request(self, request: Any) -> None:
        self.requests += 1
        if int(request.headers.get("x-stainless-retry-count") or 0) > 0:
            self.retries += 1

    def _on_response(self, response: Any) -> None:
        should = getattr(self.client, "_should_retry", None)
        retry = should(response) if should is not None else (
            response.status_code in (408, 409, 429) or response.status_code >= 500)
        self.would_retry += bool(retry)

    def close(self) -> None:
        self.client.close()

    def send(self, call: Call, ctx: Context) -> Answer:
        """`call`, its placeholders filled for `ctx`; a top-level None in its body is left out."""
        before = (self.requests, self.retries, self.would_retry)
        t0 = time.monotonic()
        answer = self._send(call, ctx)
        answer.seconds = time.monotonic() - t0
        answer.requests, answer.retries, answer.would_retry = (
            now - then for now, then in zip((self.requests, self.retries, self.would_retry),
                                            before, strict=True))
        return answer

    def _send(self, call: Call, ctx: Context) -> Answer:
        import openai

        body = {k: v for k, v in fill(dict(call.body or {}), ctx).items() if v is not None}
        headers = dict(call.headers)
        try:
            if call.route in ("completions", "chat", "responses"):
                return self._create(call, body, headers)
            if call.route == "models":
                raw = self.client.models.with_raw_response.list(extra_headers=headers)
                return _answer(raw.status_code, raw.headers, raw.text)
            if call.route == "get":
                resp = self.client.get(self.url + call.path, cast_to=self._raw_type(),
                                       options={"headers": headers})
                return _answer(resp.status_code, resp.headers, resp.text)
            if call.route == "post":
                resp = self.client.post(self.url + call.path, body=body, cast_to=self._raw_type(),
                                        options={"headers": headers})
                return _answer(resp.status_code, resp.headers, resp.text)
            if call.route == "metrics":
                return self._metrics()
            # raw: bytes the SDK will not send (NaN), on the SDK's own HTTP client
            resp = self.http.post(self.url + call.path, content=fill_text(call.data, ctx).encode(),
                                  headers={"Content-Type": "application/json", **headers})
            return _answer(resp.status_code, resp.headers, resp.text)
        except openai.APIStatusError as exc:
            return _answer(exc.status_code, exc.response.headers, _read(exc.response))
        except openai.APIError as exc:  # no answer: connection refused, timeout
            return Answer(None, error=f"{type(exc).__name__}: {exc}")

    def _metrics(self) -> Answer:
        """Every metrics endpoint's text, joined: 200 when each answered 200, else the first
        other status."""
        texts, status = [], 200
        for url in self.metrics_urls:
            try:
                resp = self.http.get(url)
            except Exception as exc:  # noqa: BLE001 - no answer: the check says so
                return Answer(None, error=f"{url}: {type(exc).__name__}: {exc}")
            texts.append(resp.text)
            if resp.status_code != 200 and status == 200:
                status = resp.status_code
        return Answer(status, body="\n".join(texts))

    def _raw_type(self) -> Any:
        import httpx2

        return httpx2.Response

    def _create(self, call: Call, body: dict[str, Any], headers: dict[str, str]) -> Answer:
        """The SDK's typed create(): the fields it knows as arguments, the rest in extra_body
        (as a client sends vLLM's own fields); `model` left out when the body has none."""
        import inspect

        import openai

        resource = {"completions": self.client.completions, "chat": self.client.chat.completions,
                    "responses": self.client.responses}[call.route]
        known = set(inspect.signature(resource.create).parameters) - {
            "extra_headers", "extra_query", "extra_body", "timeout"}
        kwargs = {k: v for k, v in body.items() if k in known}
        extra = {k: v for k, v in body.items() if k not in known}
        kwargs.setdefault("model", openai.omit)
        kwargs.update(extra_headers=headers, extra_body=extra or None)
        if call.stream:
            with resource.with_streaming_response.create(**kwargs) as resp:
                lines = list(resp.iter_lines())
                return Answer(resp.status_code, _headers(resp.headers), events=_events(lines),
                              lines=lines)
        raw = resource.with_raw_response.create(**kwargs)
        return _answer(raw.status_code, raw.headers, raw.text)


def _read(response: Any) -> str:
    try:
        return response.text
    except Exception:  # noqa: BLE001 - a streamed error body not read yet
        response.read()
        return response.text


def _headers(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def _answer(status: int, headers: Any, text: str) -> Answer:
    try:
        body: Any = json.loads(text) if text else None
    except ValueError:
        body = text
    return Answer(status, _headers(headers), body=body)


def _events(lines: Sequence[str]) -> list[Any]:
    """A stream's ``data:`` payloads, parsed (``[DONE]`` kept as the string)."""
    out: list[Any] = []
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            out.append(payload)
            continue
        try:
            out.append(json.loads(payload))
        except ValueError:
            out.append(payload)
    return out
