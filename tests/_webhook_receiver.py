"""A webhook receiver for the watch tests: an HTTP server on loopback that keeps every body POSTed to it and
answers each with the next status code it was given (200 once they run out); `arrivals` holds when each came
(`time.time()`), for the benchmarks' latencies. With `hold`, each answer waits until that event is set (a
receiver that has stopped answering)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, codes: list[int] | None = None, hold: threading.Event | None = None) -> None:
        self.bodies: list[bytes] = []
        self.arrivals: list[float] = []
        bodies, arrivals, answers = self.bodies, self.arrivals, list(codes or [])

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                arrivals.append(time.time())
                bodies.append(body)
                if hold is not None:
                    hold.wait(60)
                self.send_response(answers.pop(0) if answers else 200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
