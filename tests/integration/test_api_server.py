"""The API as `tailguard api` serves it (gunicorn gthread, keys mode), with no worker: a client
that stalls while sending its request is dropped (TAILGUARD_API_READ_TIMEOUT_S) and frees its
thread; the official openai client sending a value vLLM refuses gets a 400 and does not retry
(gunicorn's access log counts the requests the server saw); an idle keep-alive connection
stays open past a polling client's pause; it names its auth mode in its first line, /healthz
and Redis."""

from __future__ import annotations

import socket
import time

import openai
import pytest
from e2e_fixtures import http_status, serve

from tailguard import settings
from tailguard.gateway.api_keys import ApiKey, ApiKeyStore
from tailguard.host.procs import ChildSpec, tailguard_argv
from tailguard.host.redis_server import free_port
from tailguard.redis import keys

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tiny_model, redis_server, tmp_path_factory):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    logs = tmp_path_factory.mktemp("api-server")
    child = serve(ChildSpec("api", tailguard_argv("api", "--port", str(port)), env={
        settings.MODEL.env: tiny_model, settings.REDIS_URL.env: redis_server,
        settings.API_AUTH.env: settings.AUTH_KEYS, settings.API_READ_TIMEOUT_S.env: "1",
        settings.API_THREADS.env: "4"}), logs, lambda: http_status(url + "/healthz") in (200, 503))
    yield url, port, logs / "api.log"
    child.stop()


@pytest.fixture
def key(redis_client_noflush):
    store = ApiKeyStore(redis_client_noflush)
    secret = store.add(ApiKey("sdk", tokens_per_min=500))
    yield secret
    redis_client_noflush.delete(keys.API_KEYS)


def seen(log, line: str) -> int:
    """Requests gunicorn's access log shows with `line` (method and path)."""
    return log.read_text().count(f'"{line} HTTP/1.1"')


def answer(sock: socket.socket) -> bytes:
    """One whole HTTP response from `sock`: its head, then Content-Length bytes of body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def wait_for(predicate, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_the_openai_client_gets_a_400_for_an_impossible_field_and_does_not_retry(server, key,
                                                                                  tiny_model):
    url, _, log = server
    # vLLM's render layer is built in the background from the process's start: /health says
    # when (a request before waits for it)
    assert wait_for(lambda: http_status(url + "/health") == 200, 300)
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, timeout=30)  # retries: the default 2
    before = seen(log, "POST /v1/completions")
    cases = [({"seed": 2**64}, "invalid_field"), ({"extra_body": {"top_k": 10**30}}, "invalid_field"),
             ({"extra_body": {"min_tokens": 5000}, "max_tokens": 100_000}, "invalid_field"),
             ({"temperature": -1}, "invalid_field"), ({"extra_body": {"top_k": -5}}, "invalid_field"),
             ({"n": 3, "temperature": 0}, "invalid_field"),
             ({"extra_body": {"guided_json": {"type": "object"}}}, "invalid_field"),
             ({"max_tokens": 600}, "over_key_limit")]  # more than the key's whole 500 tokens/min
    for extra, code in cases:
        with pytest.raises(openai.BadRequestError) as exc:
            client.completions.create(model=tiny_model, prompt="hi", **extra)
        assert exc.value.status_code == 400 and exc.value.code == code, extra
    # one request each reached the server: none was retried (the client retries before it
    # raises, so every request it made is in the log once the last one is)
    assert wait_for(lambda: seen(log, "POST /v1/completions") - before >= len(cases))
    assert seen(log, "POST /v1/completions") - before == len(cases)


def test_a_client_that_stalls_mid_request_is_dropped_and_frees_its_thread(server):
    url, port, _ = server
    # more stalled clients than the API has threads (4): each is dropped after its timeout
    stalled = []
    for _ in range(6):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # headers never end
        stalled.append(s)
    for s in stalled:
        assert s.recv(1024) == b""  # closed by the server
        s.close()
    assert http_status(url + "/healthz") in (200, 503)

    body = socket.create_connection(("127.0.0.1", port), timeout=30)
    body.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer tg-x\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
    got = answer(body)
    body.close()
    # keys mode refuses the unknown key before the body is read (401), or the body read times
    # out (408): either way an answer, and no thread kept
    assert got.split(b" ")[1] in (b"401", b"408"), got[:200]
    assert http_status(url + "/healthz") in (200, 503)


def test_a_body_that_stalls_is_a_408(server, key):
    _, port, _ = server
    body = socket.create_connection(("127.0.0.1", port), timeout=30)
    body.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 + f"Authorization: Bearer {key}\r\n".encode()
                 + b"Content-Length: 100\r\n\r\n{\"prompt\": ")
    got = answer(body)
    body.close()
    assert got.startswith(b"HTTP/1.1 408"), got[:300]
    assert b"request_timeout" in got


def test_an_idle_keep_alive_connection_outlives_gunicorns_default_2_s(server):
    """A client that polls every few seconds on one connection (httpx keeps it 5 s) must not
    find it closed by the server as its next request goes out: that request gets no response."""
    _, port, _ = server
    conn = socket.create_connection(("127.0.0.1", port), timeout=30)
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    conn.sendall(request)
    assert answer(conn).split(b" ")[1] in (b"200", b"503")
    time.sleep(3)  # idle past gunicorn's default --keep-alive, within httpx's 5 s
    conn.sendall(request)
    again = answer(conn)
    conn.close()
    assert again.split(b" ")[1:2] in ([b"200"], [b"503"]), again[:200]


def test_the_served_api_names_its_auth_mode_first_in_healthz_and_in_redis(server,
                                                                          redis_client_noflush):
    import requests

    url, _, log = server
    assert log.read_text().splitlines()[0].startswith("tailguard api: auth mode keys: ")
    assert requests.get(url + "/healthz", timeout=10).json()["auth"] == "keys"
    assert ApiKeyStore(redis_client_noflush).served_mode() == "keys"  # what `keys add` reads
