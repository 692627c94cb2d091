"""`lightning_rlpt.http_client`, the one HTTP client of the package, against a raw socket server
that misbehaves on purpose: each failure comes back as an `HTTPFailure` of the kind the callers'
messages name, a body is capped, a redirect is handed back, never followed, and the deadline
covers the whole answer, not each read."""
import socket
import threading
import time

import pytest

from lightning_rlpt.http_client import HTTPFailure, exchange

ANSWERS = {
    "/ok": [b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"a\": [1]}\n"],
    "/torn": [b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"a\": [1"],  # then the connection drops
    "/big": [b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 1000],
    "/moved": [b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://elsewhere/x\r\nContent-Length: 0\r\n\r\n"],
    "/drip": [b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n"] + [b"x"] * 40,  # a byte every 0.1 s
    "/silent": [],  # reads the request, never answers
    "/error": [b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\n\r\nerror"],  # then closes, late
}


@pytest.fixture(scope="module")
def server():
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn):
        with conn:
            path = conn.recv(65536).split(b" ")[1].decode()
            for i, part in enumerate(ANSWERS[path]):
                if path == "/drip" and i:
                    time.sleep(0.1)
                conn.sendall(part)
            if path == "/silent":
                stop.wait(10)
            if path == "/error":  # as uvicorn after an unhandled exception: closed without saying so, not at once
                time.sleep(0.5)

    def accept():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    listener.close()


def test_an_answer_read_whole(server):
    answer = exchange("GET", server + "/ok", timeout=5)
    assert (answer.status, answer.json(), answer.whole, answer.length) == (200, {"a": [1]}, True, "11")


def test_a_body_cut_short_of_its_length_is_an_incomplete_read(server):
    with pytest.raises(HTTPFailure) as err:
        exchange("GET", server + "/torn", timeout=5)
    assert err.value.kind == "IncompleteRead"


def test_a_body_past_the_cap_is_cut_there_and_said_so(server):
    answer = exchange("GET", server + "/big", timeout=5, max_bytes=100)
    assert (len(answer.data), answer.whole, answer.length) == (100, False, "1000")
    assert exchange("GET", server + "/big", timeout=5, max_bytes=1000).whole  # exactly the cap: whole


def test_a_redirect_is_handed_back_not_followed(server):
    answer = exchange("POST", server + "/moved", json={"secret": 1}, headers={"Authorization": "x"}, timeout=5)
    assert (answer.status, answer.location) == (307, "http://elsewhere/x")


def test_the_deadline_covers_the_whole_answer_not_each_read(server):
    started = time.monotonic()
    with pytest.raises(HTTPFailure, match=r"ReadTimeout: the answer took more than 1 s"):
        exchange("GET", server + "/drip", timeout=1)  # each byte comes within 0.1 s: 4 s in all
    assert time.monotonic() - started < 2


def test_a_silent_server_is_a_read_timeout_and_a_closed_port_a_connection_error(server):
    with pytest.raises(HTTPFailure) as err:
        exchange("GET", server + "/silent", timeout=0.5)
    assert err.value.kind == "ReadTimeout"
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(HTTPFailure) as err:
        exchange("GET", f"http://127.0.0.1:{port}/", timeout=5)
    assert err.value.kind == "ConnectionError"


def test_a_request_after_an_error_answer_goes_on_a_fresh_connection(server):
    """The server closes the connection after its 500 without a ``Connection: close``: a client that
    kept it would send the next request into it and get a reset (a healthy vLLM server was dropped
    that way after the snapshot-directory probe's expected 500)."""
    from lightning_rlpt.http_client import new_client

    client = new_client()
    assert exchange("POST", server + "/error", json={}, timeout=5, client=client).status == 500
    assert exchange("POST", server + "/ok", json={}, timeout=5, client=client).json() == {"a": [1]}
