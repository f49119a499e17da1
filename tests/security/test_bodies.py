"""Bodies cannot hold the front door: a caller without a key is answered before any byte of its body is read; an
upload is refused the moment its file passes the limit, with nothing kept; a body that does not arrive within
body_timeout_s is cut off while other requests are served; connections past max_connections are refused."""

import asyncio
import socket
import time

import httpx
import pytest

from tests.security.front_door import call, front_door, served_over_http

# Routes that take a body: the generation routes (served in front of FastAPI), FastAPI routes with a JSON model,
# the multipart upload, an admin route, one that does not exist
BODY_ROUTES = ["/v1/chat/completions", "/v1/completions", "/inference/v1/generate", "/tokenize", "/v1/files",
               "/v1/batches", "/v1/admin/deployments", "/v1/no-such-route"]
SLOW_BODY_MARGIN_S = 3.0  # what the test allows past body_timeout_s: scheduling on a busy 2-core machine


def asgi_request(app, path: str, headers: list[tuple[bytes, bytes]], client: str = "10.0.0.5"):
    """(status, headers, how many times the app asked for the body) of a POST whose body never arrives."""
    asked, started = [], []

    async def receive_nothing():
        asked.append(1)
        await asyncio.Event().wait()  # never

    async def send(message):
        if message["type"] == "http.response.start":
            started.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": headers, "client": (client, 1234), "server": ("front", 80), "scheme": "http",
             "root_path": "", "http_version": "1.1", "asgi": {"version": "3.0"}}
    asyncio.run(asyncio.wait_for(app(scope, receive_nothing, send), timeout=5))
    return started[0]["status"], dict(started[0]["headers"]), len(asked)


@pytest.mark.parametrize("path", BODY_ROUTES)
def test_a_caller_without_a_key_is_answered_before_its_body_is_read(tmp_path, path):
    app, keys, _ = front_door(tmp_path, open_mode=False)
    keys.create("team-a")
    huge = [(b"content-type", b"application/json"), (b"content-length", str(10**12).encode())]
    for headers in (huge, [*huge, (b"authorization", b"Bearer rs-not-a-key")]):
        status, answer_headers, body_reads = asgi_request(app, path, headers)
        assert (status, body_reads) == (401, 0)
        assert answer_headers[b"connection"] == b"close"  # the body nobody reads is not received either


def test_over_a_socket_a_huge_declared_body_without_a_key_gets_a_401_at_once(tmp_path):
    app, _, settings = front_door(tmp_path, open_mode=False)
    with served_over_http(app, settings) as (host, port), socket.create_connection((host, port), timeout=5) as conn:
        started = time.monotonic()
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: front\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000000000000\r\n\r\n{\"model\": ")
        answer = read_until_closed(conn)
        assert answer.startswith(b"HTTP/1.1 401") and b"missing_api_key" in answer
        assert time.monotonic() - started < 5


def multipart_upload(file_chunks, boundary: str = "b0undary"):
    """A POST /v1/files body streamed from `file_chunks` (chunked: no Content-Length), and its headers."""
    async def body():
        yield (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\n"
               f"Content-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n"
               f"Content-Type: application/jsonl\r\n\r\n").encode()
        for chunk in file_chunks:
            yield chunk
        yield f"\r\n--{boundary}--\r\n".encode()
    return body(), {"content-type": f"multipart/form-data; boundary={boundary}"}


def test_an_upload_is_refused_as_its_file_passes_the_limit_and_nothing_is_kept(tmp_path):
    limit = 64 * 2**10
    app, _, settings = front_door(tmp_path, open_mode=True, batches_max_file_bytes=limit)
    files_dir = tmp_path / "batches" / "files"
    line = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "m"}}\n'
    assert call(app, "POST", "/v1/files", files={"file": ("in.jsonl", line)}).status_code == 200
    kept = set(files_dir.iterdir())

    over = call(app, "POST", "/v1/files", files={"file": ("in.jsonl", b"x" * (limit + 1))})
    assert over.status_code == 413 and over.json()["error"]["param"] == "file"

    # A 1 GiB file, streamed: the server reads at most the limit, the form's own 64 KiB and one chunk, keeps none
    # of it in memory after the refusal, and writes none of it to disk (its own store or a spool file).
    chunk, sent = b"x" * 2**16, []

    def gigabyte():
        for _ in range(2**30 // len(chunk)):
            sent.append(len(chunk))
            yield chunk
    body, headers = multipart_upload(gigabyte())
    streamed = call(app, "POST", "/v1/files", content=body, headers=headers)
    assert streamed.status_code == 413 and streamed.json()["error"]["code"] == "file_too_large"
    assert sum(sent) <= limit + 64 * 2**10 + len(chunk)
    assert set(files_dir.iterdir()) == kept


def read_until_closed(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (socket.timeout if it does not in time)."""
    received = b""
    while piece := conn.recv(65536):
        received += piece
    return received


@pytest.mark.parametrize("path, content_type", [("/v1/chat/completions", "application/json"),
                                                ("/v1/files", "multipart/form-data; boundary=b0undary")])
def test_a_body_that_stalls_is_cut_off_after_body_timeout_s_while_others_are_served(tmp_path, path, content_type):
    timeout_s = 1.0
    app, _, settings = front_door(tmp_path, open_mode=True, body_timeout_s=timeout_s)
    with served_over_http(app, settings) as (host, port):
        slow = socket.create_connection((host, port), timeout=timeout_s + SLOW_BODY_MARGIN_S)
        started = time.monotonic()
        slow.sendall(f"POST {path} HTTP/1.1\r\nHost: front\r\nContent-Type: {content_type}\r\n"
                     f"Content-Length: 1000\r\n\r\n--b0un".encode())  # then nothing more
        assert httpx.get(f"http://{host}:{port}/health", timeout=5).status_code == 200  # served meanwhile
        answer = read_until_closed(slow)  # raises socket.timeout when not cut off within the margin
        elapsed = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408") and b"body_timeout_s" in answer, answer
        assert timeout_s <= elapsed < timeout_s + SLOW_BODY_MARGIN_S
        slow.close()
        assert httpx.get(f"http://{host}:{port}/health", timeout=5).status_code == 200


def test_connections_past_max_connections_are_refused(tmp_path):
    app, _, settings = front_door(tmp_path, open_mode=True, max_connections=2)
    with served_over_http(app, settings) as (host, port):
        held = [socket.create_connection((host, port), timeout=5) for _ in range(2)]
        # The server counts a connection once its loop has accepted it (on a busy machine, not at once)
        assert health_becomes(host, port, 503), "a third connection was served while two were open"
        for conn in held:
            conn.close()
        assert health_becomes(host, port, 200), "refused after the two connections closed"


def health_becomes(host: str, port: int, status: int, within_s: float = 5.0) -> bool:
    """Whether GET /health answers `status` within `within_s`, asked every 0.1 s on a new connection."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if httpx.get(f"http://{host}:{port}/health", timeout=5).status_code == status:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sent", [b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: fr"])
def test_a_connection_whose_headers_do_not_arrive_is_closed_after_headers_timeout_s(tmp_path, sent):
    timeout_s = 1.0
    app, _, settings = front_door(tmp_path, open_mode=True, headers_timeout_s=timeout_s, max_connections=2)
    with served_over_http(app, settings) as (host, port):
        started = time.monotonic()  # before the connection opens: the server's deadline runs from its opening
        idle = socket.create_connection((host, port), timeout=timeout_s + SLOW_BODY_MARGIN_S)
        idle.sendall(sent)  # nothing, or half a request's headers; then nothing more
        assert read_until_closed(idle) == b""  # closed, without an answer, before the socket's timeout
        assert timeout_s <= time.monotonic() - started < timeout_s + SLOW_BODY_MARGIN_S
        idle.close()
        assert httpx.get(f"http://{host}:{port}/health", timeout=5).status_code == 200


def get_keeping_alive(conn: socket.socket) -> bytes:
    """One GET /health on an open connection, kept alive: the answer's status line."""
    conn.sendall(b"GET /health HTTP/1.1\r\nHost: front\r\n\r\n")
    received = b""
    while b"\r\n\r\n" not in received:
        received += conn.recv(65536) or b"!closed"
        if received.endswith(b"!closed"):
            return received
    head, body = received.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += conn.recv(65536)
    return head.split(b"\r\n")[0]


def test_an_idle_connection_outlives_the_clients_pool_expiry_and_is_closed_after_keep_alive_timeout_s(tmp_path):
    """Clients keep idle connections pooled for seconds (httpx 5 s, aiohttp 15 s) and reuse them: the server must
    not close one first (the request sent as it closes fails with no answer), yet idle ones are closed in time."""
    app, _, settings = front_door(tmp_path, open_mode=True)
    with served_over_http(app, settings) as (host, port), socket.create_connection((host, port), timeout=10) as conn:
        assert get_keeping_alive(conn) == b"HTTP/1.1 200 OK"
        time.sleep(6.0)  # longer than httpx's pool keeps it, and than uvicorn's default keep-alive
        assert get_keeping_alive(conn) == b"HTTP/1.1 200 OK"
    app, _, settings = front_door(tmp_path, open_mode=True, keep_alive_timeout_s=1.0)
    with served_over_http(app, settings) as (host, port), socket.create_connection((host, port), timeout=10) as conn:
        assert get_keeping_alive(conn) == b"HTTP/1.1 200 OK"
        started = time.monotonic()
        assert read_until_closed(conn) == b""
        assert 1.0 <= time.monotonic() - started + 0.05 < 1.0 + SLOW_BODY_MARGIN_S
