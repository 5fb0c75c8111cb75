"""The ASGI app uvicorn (with h11) serves to the upstream client's
real-server test (gateway/src/upstream/http1_servers.rs); nginx proxies
to it as well. Every answer names the client's port in `x-peer`, so the
test can tell which connection carried it.

  /length/N    N bytes with a Content-Length
  /chunked/N   N bytes in pieces without one (h11 frames them chunked)
  /sse/N/MS    N server-sent events MS milliseconds apart, then [DONE]
  /close       a short body with `Connection: close`

Body bytes are (i * 7 + 13) % 256 for i in 0..N, as the test computes them.
"""

import asyncio


def pattern(length):
    return bytes((i * 7 + 13) % 256 for i in range(length))


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    parts = scope["path"].strip("/").split("/")
    headers = [(b"x-peer", str(scope["client"][1]).encode())]

    async def start(status=200, extra=()):
        await send({"type": "http.response.start", "status": status, "headers": headers + list(extra)})

    if parts[0] == "length" and len(parts) == 2:
        body = pattern(int(parts[1]))
        await start(extra=[(b"content-length", str(len(body)).encode())])
        await send({"type": "http.response.body", "body": body})
    elif parts[0] == "chunked" and len(parts) == 2:
        body = pattern(int(parts[1]))
        await start()
        for at in range(0, len(body), 7000):
            await send({"type": "http.response.body", "body": body[at : at + 7000], "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    elif parts[0] == "sse" and len(parts) == 3:
        await start(extra=[(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")])
        for index in range(int(parts[1])):
            await send({"type": "http.response.body", "body": b"data: %d\n\n" % index, "more_body": True})
            await asyncio.sleep(int(parts[2]) / 1000)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
    elif parts == ["close"]:
        await start(extra=[(b"content-length", b"5"), (b"connection", b"close")])
        await send({"type": "http.response.body", "body": b"close"})
    else:
        await start(404, [(b"content-length", b"0")])
        await send({"type": "http.response.body", "body": b""})
