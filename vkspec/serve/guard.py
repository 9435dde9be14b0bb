"""What a request must pass before any route sees it (an ASGI middleware):

* Host: the server's own name. A DNS-rebinding page reaches a loopback
  server under the attacker's name (Host: evil.example), so only loopback
  names, the bound address and --allow-host names pass; IP literals pass
  when the server listens on every address (no name can be rebound there).
* Origin, when a browser sends one: the server's own origin (http or https
  and exactly the Host), so a cross-site page cannot drive it ("null", a
  page on another port, another name: 403).
* Authorization: ``Bearer <key>`` when the server has an API key (401).
  /health stays open for liveness checks.
* Content-Type: application/json on any request with a body (415), so a
  cross-site "simple" POST (text/plain, forms) is refused even without Origin.
* Size: a Content-Length over the limit is refused before a byte is read;
  a chunked body is counted as it arrives and refused once it passes the
  limit (413). The rest of an unread body is discarded by the HTTP layer,
  never held.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
from urllib.parse import urlsplit

LOOPBACK_NAMES = {"localhost", "localhost.", "ip6-localhost"}
WILDCARDS = {"0.0.0.0", "::", ""}


def _ip(name: str):
    try:
        return ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    ip = _ip(host)
    return host.lower() in LOOPBACK_NAMES if ip is None else ip.is_loopback


def host_name(value: str) -> str | None:
    """The name part of a Host header value ("[::1]:8000" -> "::1"); None if malformed."""
    try:
        u = urlsplit("//" + value)
        name = u.hostname
        u.port                                  # raises on a bad port
    except ValueError:
        return None
    return name


class Guard:
    def __init__(self, app, *, bind_host: str = "127.0.0.1", allow_hosts=(), api_key: str | None = None,
                 max_body: int = 8 << 20, open_paths=("/health",)):
        self.app, self.api_key, self.max_body, self.open_paths = app, api_key or None, max_body, set(open_paths)
        self.bind_host = bind_host.strip("[]").lower()
        self.allow_hosts = {h.lower() for h in allow_hosts}

    def host_allowed(self, name: str) -> bool:
        name = name.lower()
        if name in self.allow_hosts or name == self.bind_host or is_loopback(name):
            return True
        return self.bind_host in WILDCARDS and _ip(name) is not None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers: dict[str, str] = {}
        for k, v in scope["headers"]:
            headers.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))

        host = headers.get("host")
        if host is not None:
            name = host_name(host)
            if name is None or not self.host_allowed(name):
                return await _refuse(send, 403, f"Host {host!r} is not this server's name "
                                     "(--allow-host adds names)", "forbidden_host")
        origin = headers.get("origin")
        if origin is not None:
            u = urlsplit(origin)
            if u.scheme not in ("http", "https") or host is None or u.netloc.lower() != host.lower() \
                    or u.path not in ("", "/"):
                return await _refuse(send, 403, f"Origin {origin!r} is not this server's own origin",
                                     "forbidden_origin")

        if self.api_key and scope["path"] not in self.open_paths:
            auth = headers.get("authorization", "")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(),
                                                                         self.api_key.encode()):
                return await _refuse(send, 401, "a valid API key is required (Authorization: Bearer ...)",
                                     "invalid_api_key", extra=[(b"www-authenticate", b"Bearer")])

        length = headers.get("content-length")
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if (length not in (None, "0") or chunked) and scope["method"] not in ("GET", "HEAD"):
            media = headers.get("content-type", "").split(";")[0].strip().lower()
            if media != "application/json":
                return await _refuse(send, 415, f"the body must be application/json, not "
                                     f"{media or 'untyped'}", "unsupported_media_type")
        if length is not None:
            if not length.isdigit():
                return await _refuse(send, 400, "a bad Content-Length", "bad_request")
            if int(length) > self.max_body:
                return await _refuse(send, 413, f"the body is {int(length)} bytes; this server takes at most "
                                     f"{self.max_body} (--max-body-mb)", "body_too_large")
        if scope["method"] in ("GET", "HEAD"):
            return await self.app(scope, receive, send)

        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            part = msg.get("body", b"")
            size += len(part)
            if size > self.max_body:
                return await _refuse(send, 413, f"the body is over {self.max_body} bytes, the most this "
                                     "server takes (--max-body-mb)", "body_too_large")
            chunks.append(part)
            if not msg.get("more_body", False):
                break
        body, delivered = b"".join(chunks), False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()          # after the body: waits for the client to disconnect
        await self.app(scope, replay, send)


async def _refuse(send, status: int, message: str, code: str, extra=()):
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": code}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})
