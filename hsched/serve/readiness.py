"""Whether a replica takes traffic: an HTTP GET of its readiness path answers 2xx, or (no path) its port accepts a
connection. One check, bounded by timeout_s; the service manager repeats it until the replica is ready."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

import aiohttp


async def ready(base_url: str, path: str | None, timeout_s: float = 2.0) -> bool:
    """True when the replica at base_url ('http://host:port') is ready: GET path answers 2xx (path given), or a TCP
    connection to its port is accepted (path None). Never raises for a replica that is down or slow: False."""
    try:
        async with asyncio.timeout(timeout_s):
            if path is None:
                return await _accepts(base_url)
            url = base_url.rstrip("/") + "/" + path.lstrip("/")
            async with aiohttp.ClientSession() as session, session.get(url, allow_redirects=False) as resp:
                return 200 <= resp.status < 300
    except (TimeoutError, OSError, aiohttp.ClientError, ValueError):
        return False


async def _accepts(base_url: str) -> bool:
    parts = urlsplit(base_url)
    if parts.hostname is None:
        raise ValueError(f"no host in {base_url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    _, writer = await asyncio.open_connection(parts.hostname, port)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True
