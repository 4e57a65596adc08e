"""Sources that need more than plain HTTP, mirrored by ``rsnotify subscribe`` (issue 17 item 8).

* an HTTPS Source whose certificate comes from a CA made here with the
  ``openssl`` CLI: mirrored with ``--ca``, refused with a one-line hint without;
* a Source that requires a bearer token, with a mirror host (``rs:ln
  rel="duplicate"``, and a redirect from the Source) that must never see it;
* a Source that answers 429 with ``Retry-After`` for a while: mirrored, and the
  wait honoured, read from the server's own request log (one connection to the
  origin, ``--max-connections 1``, so "the next request" is well defined).

Each Source is an aiohttp app in this process serving a Resource List and a
Change List generated from the request's own origin; the subscriber runs in
its own process with ``--once``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

from tests.devstack import ManagedProcess, free_port

NS = (
    'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
    'xmlns:rs="http://www.openarchives.org/rs/terms/"'
)
TOKEN = "Bearer s3cret-8f2d"
RESOURCES = {f"r{i}.txt": f"resource {i}\n".encode() * (i + 1) for i in range(5)}
BASELINE = ["r0.txt", "r1.txt", "r2.txt", "r3.txt"]  # r4 is created in the Change List


def _md(body: bytes, extra: str = "") -> str:
    digest = hashlib.sha256(body).hexdigest()
    return f'<rs:md hash="sha-256:{digest}" length="{len(body)}"{extra}/>'


class Source:
    """A ResourceSync Source served by aiohttp, logging (monotonic time, path, status, headers)."""

    def __init__(self, *, mirror: str | None = None) -> None:
        self.mirror = mirror  # base URL of the mirror host (r1 duplicated there, r2 redirected)
        self.log: list[tuple[float, str, int, dict[str, str]]] = []
        self.gate: Callable[[web.Request], web.Response | None] | None = None
        self.app = web.Application(middlewares=[self._record])
        self.app.router.add_get("/{name}", self.document)

    @web.middleware
    async def _record(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        arrived = time.monotonic()
        refused = self.gate(request) if self.gate is not None else None
        response = refused if refused is not None else await handler(request)
        self.log.append((arrived, request.path, response.status, dict(request.headers)))
        return response

    async def document(self, request: web.Request) -> web.Response:
        base = f"{request.scheme}://{request.host}"
        name = request.match_info["name"]
        if name == "capabilitylist.xml":
            text = (
                f'<urlset {NS}><rs:md capability="capabilitylist"/>'
                f'<url><loc>{base}/resourcelist.xml</loc><rs:md capability="resourcelist"/></url>'
                f'<url><loc>{base}/changelist.xml</loc><rs:md capability="changelist"/></url>'
                "</urlset>"
            )
        elif name == "resourcelist.xml":
            urls = ""
            for n in BASELINE:
                link = ""
                if n == "r1.txt" and self.mirror:
                    link = f'<rs:ln rel="duplicate" href="{self.mirror}/{n}" pri="1"/>'
                urls += (
                    f"<url><loc>{base}/{n}</loc><lastmod>2024-01-01T00:00:00Z</lastmod>"
                    f"{_md(RESOURCES[n])}{link}</url>"
                )
            text = (
                f'<urlset {NS}><rs:ln rel="up" href="{base}/capabilitylist.xml"/>'
                '<rs:md capability="resourcelist" at="2024-01-02T00:00:00Z" '
                f'completed="2024-01-02T00:00:00Z"/>{urls}</urlset>'
            )
        elif name == "changelist.xml":
            created = _md(RESOURCES["r4.txt"], extra=' change="created"')
            text = (
                f'<urlset {NS}><rs:ln rel="up" href="{base}/capabilitylist.xml"/>'
                '<rs:md capability="changelist" from="2024-01-02T00:00:00Z"/>'
                f"<url><loc>{base}/r4.txt</loc><lastmod>2024-01-03T00:00:00Z</lastmod>"
                f"{created}</url></urlset>"
            )
        elif name in RESOURCES:
            if name == "r2.txt" and self.mirror:
                raise web.HTTPFound(f"{self.mirror}/{name}")
            return web.Response(body=RESOURCES[name], content_type="text/plain")
        else:
            raise web.HTTPNotFound()
        return web.Response(text=text, content_type="application/xml")


class Mirror:
    """A second origin holding copies of r1 and r2, logging every request's headers."""

    def __init__(self) -> None:
        self.log: list[dict[str, str]] = []
        self.app = web.Application()
        self.app.router.add_get("/{name}", self.resource)

    async def resource(self, request: web.Request) -> web.Response:
        self.log.append(dict(request.headers))
        name = request.match_info["name"]
        if name not in RESOURCES:
            raise web.HTTPNotFound()
        return web.Response(body=RESOURCES[name], content_type="text/plain")


@asynccontextmanager
async def serve(app: web.Application, tls: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls).start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def subscribe(
    rsnotify_process: Callable[..., ManagedProcess],
    url: str,
    into: Path,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> ManagedProcess:
    process = rsnotify_process(
        "subscribe", url, "--into", into, "--once", "--log-level", "info", *args, env=env
    )
    await asyncio.to_thread(process.wait, timeout)
    return process


def mirrored(into: Path, names: list[str]) -> dict[str, bytes]:
    found = {path.name: path.read_bytes() for path in into.rglob("r*.txt")}
    return {name: found.get(name, b"") for name in names}


# --- HTTPS with a private CA --------------------------------------------------------


def make_ca(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1, with the ``openssl`` CLI."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise AssertionError("openssl is not installed; run `make services`")
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_pem = directory / "ca.key", directory / "ca.pem"
    key, csr, pem = directory / "server.key", directory / "server.csr", directory / "server.pem"
    ext = directory / "server.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid,issuer\nsubjectKeyIdentifier=hash\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run = [
        [openssl, "req", "-x509", *ec, "-keyout", ca_key, "-out", ca_pem, "-days", "2",
         "-subj", "/CN=rsnotify test CA", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        [openssl, "req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
        [openssl, "x509", "-req", "-in", csr, "-CA", ca_pem, "-CAkey", ca_key,
         "-CAcreateserial", "-out", pem, "-days", "2", "-extfile", ext],
    ]  # fmt: skip
    for argv in run:
        subprocess.run([str(a) for a in argv], check=True, capture_output=True, timeout=30)
    return ca_pem, pem, key


async def test_https_source_with_a_private_ca(rsnotify_process, tmp_path):
    ca, cert, key = await asyncio.to_thread(make_ca, tmp_path / "pki")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    source = Source()
    async with serve(source.app, tls) as base:
        refused = await subscribe(
            rsnotify_process, f"{base}/capabilitylist.xml", tmp_path / "refused"
        )
        assert refused.returncode != 0
        assert "TLS certificate not trusted" in refused.output()
        assert "--ca FILE" in refused.output()
        done = await subscribe(
            rsnotify_process, f"{base}/capabilitylist.xml", tmp_path / "mirror", "--ca", str(ca)
        )
    assert done.returncode == 0, done.tail()
    assert mirrored(tmp_path / "mirror", list(RESOURCES)) == RESOURCES


# --- a token, and a mirror that must never see it ----------------------------------


async def test_token_goes_to_the_source_and_never_to_the_mirror(rsnotify_process, tmp_path):
    mirror = Mirror()
    async with serve(mirror.app) as mirror_url:
        source = Source(mirror=mirror_url)

        def require_token(request: web.Request) -> web.Response | None:
            if request.headers.get("Authorization") != TOKEN:
                return web.Response(status=401, headers={"WWW-Authenticate": "Bearer"})
            return None

        source.gate = require_token
        async with serve(source.app) as base:
            # The token through the environment keeps it out of the process list.
            env = {**os.environ, "RSNOTIFY_SUBSCRIBE_HEADER": f"Authorization: {TOKEN}"}
            done = await subscribe(
                rsnotify_process,
                f"{base}/capabilitylist.xml",
                tmp_path / "mirror",
                "--allow-origin", mirror_url,
                env=env,
            )  # fmt: skip
            without = await subscribe(
                rsnotify_process, f"{base}/capabilitylist.xml", tmp_path / "without"
            )
    assert done.returncode == 0, done.tail()
    assert mirrored(tmp_path / "mirror", list(RESOURCES)) == RESOURCES
    assert without.returncode != 0 and "401" in without.output()
    # The mirror served r1 (the duplicate) and r2 (the Source's redirect)...
    assert len(mirror.log) >= 2
    # ...and never received the token, nor any Authorization at all.
    assert all("Authorization" not in headers for headers in mirror.log)
    sent = [h.get("Authorization") for _, _, status, h in source.log if status != 401]
    assert sent and all(value == TOKEN for value in sent)
    assert TOKEN not in done.output()  # not logged either


# --- 429 with Retry-After ------------------------------------------------------------


async def test_retry_after_is_honoured_while_mirroring(rsnotify_process, tmp_path):
    source = Source()
    busy_until = 0.0
    window = 2.5  # seconds of 429s, starting at the first resource request

    def busy_for_a_while(request: web.Request) -> web.Response | None:
        nonlocal busy_until
        if not request.path.startswith("/r") or request.path.startswith("/resourcelist"):
            return None
        now = time.monotonic()
        if busy_until == 0.0:
            busy_until = now + window
        if now < busy_until:
            return web.Response(status=429, headers={"Retry-After": "1"})
        return None

    source.gate = busy_for_a_while
    async with serve(source.app) as base:
        done = await subscribe(
            rsnotify_process, f"{base}/capabilitylist.xml", tmp_path / "mirror",
            "--max-connections", "1",
        )  # fmt: skip
    assert done.returncode == 0, done.tail()
    assert mirrored(tmp_path / "mirror", list(RESOURCES)) == RESOURCES
    log = sorted(source.log)
    busy = [i for i, (_, _, status, _) in enumerate(log) if status == 429]
    assert len(busy) >= 2, log
    for i in busy:
        answered_at = log[i][0]
        following = log[i + 1][0]  # one connection: the next request came after this answer
        assert following - answered_at >= 1.0, (log[i], log[i + 1])
    assert log[busy[-1]][0] + 1.0 <= log[-1][0]
