"""A fault-injecting HTTP proxy for the object-storage tests: it sits between tlio and
the local S3 server (tests/s3_server.py) on 127.0.0.1, forwards every request as it
came, and on the requests a rule matches loses the reply, fails, drops or holds them,
so a test can show what a client does when a reply is lost after the server acted.

    python tests/fault_proxy.py UPSTREAM_URL

prints ``http://127.0.0.1:PORT`` on its first line (the endpoint to give the client),
then answers each request line on standard input with one line, ``ok [VALUE]`` or
``err MESSAGE``:

    rule METHOD PATTERN NTH ACTION [ARGS]  add a rule; its id
    hits ID                              how many requests rule ID acted on so far
    seen ID                              how many requests rule ID matched so far
    clear                                remove every rule

A rule matches a request whose method is METHOD (``*``: any) and whose path (``/BUCKET
/KEY``, percent-decoded, without the query) matches the Python regular expression
PATTERN (``re.search``). NTH says which of the matching requests it acts on: ``3`` the
third one only, ``3+`` the third and every later one, ``*`` every one. ACTION is one of

    store-drop   forward the request, let the server act on it, then close the client's
                 connection without a byte of the reply (a reply lost on the way back)
    store-500    forward the request, then answer 500 InternalError instead of the reply
    drop         close the connection without forwarding (the server never sees it)
    delay MS     hold the request MS milliseconds, then forward it normally
    answer STATUS CODE
                 answer STATUS with an S3 XML error body whose Code is CODE, without
                 forwarding (a server refusing a token, a key or a signature); a HEAD
                 gets the status alone, as S3 sends it

Rules are tried in the order they were added; the first that acts wins. Standard
library only. When standard input ends the proxy stops. Nothing here leaves loopback.
"""

import http.client
import http.server
import re
import socketserver
import sys
import threading
import time
import urllib.parse

ACTIONS = ("store-drop", "store-500", "drop", "delay", "answer")
# How long a forwarded request may wait for the server.
UPSTREAM_TIMEOUT_S = 120
# Headers that describe one hop, never forwarded as they came.
HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "upgrade"}
INTERNAL_ERROR = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message></Error>"
)


class Rule:
    def __init__(self, method, pattern, nth, action, ms, answer=None):
        self.method = method
        self.pattern = re.compile(pattern)
        self.first, self.onward = nth
        self.action = action
        self.ms = ms
        self.answer = answer
        self.seen = 0
        self.hits = 0

    def take(self, method, path):
        """Whether this rule acts on the request (counting it when it matches)."""
        if self.method not in ("*", method) or not self.pattern.search(path):
            return False
        self.seen += 1
        if self.first == 0:
            act = True
        elif self.onward:
            act = self.seen >= self.first
        else:
            act = self.seen == self.first
        if act:
            self.hits += 1
        return act


RULES = []
LOCK = threading.Lock()
UPSTREAM = None


def parse_nth(text):
    if text == "*":
        return (0, True)
    onward = text.endswith("+")
    n = int(text.rstrip("+"))
    if n < 1:
        raise ValueError("NTH counts from 1")
    return (n, onward)


def pick(method, path):
    with LOCK:
        for rule in RULES:
            if rule.take(method, path):
                return rule.action, (rule.answer if rule.action == "answer" else rule.ms)
    return None, 0


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def forward(self, body):
        conn = http.client.HTTPConnection(UPSTREAM.hostname, UPSTREAM.port, timeout=UPSTREAM_TIMEOUT_S)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            reply = conn.getresponse()
            return reply.status, reply.reason, reply.getheaders(), reply.read()
        finally:
            conn.close()

    def answer(self, status, reason, headers, data):
        self.send_response_only(status, reason)
        for name, value in headers:
            if name.lower() not in HOP_HEADERS and name.lower() != "content-length":
                self.send_header(name, value)
        if self.command == "HEAD":
            length = dict((k.lower(), v) for k, v in headers).get("content-length", str(len(data)))
            self.send_header("Content-Length", length)
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def lose(self):
        """Close the client's connection, writing nothing more."""
        self.close_connection = True
        self.wfile.flush()

    def handle_any(self):
        body = self.read_body()
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        action, ms = pick(self.command, path)
        if action == "drop":
            return self.lose()
        if action == "answer":
            status, code = ms
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>Refused by the fault proxy ({code}).</Message></Error>"
            ).encode()
            headers = [("Content-Type", "application/xml")]
            return self.answer(status, http.HTTPStatus(status).phrase, headers, body)
        if action == "delay":
            time.sleep(ms / 1000)
        try:
            status, reason, headers, data = self.forward(body)
        except OSError:
            return self.lose()
        if action == "store-drop":
            return self.lose()
        if action == "store-500":
            headers = [("Content-Type", "application/xml")]
            return self.answer(500, "Internal Server Error", headers, INTERNAL_ERROR)
        self.answer(status, reason, headers, data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def request(words):
    cmd, args = words[0], words[1:]
    if cmd == "rule":
        method, pattern, nth, action = args[:4]
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r} (one of {', '.join(ACTIONS)})")
        ms = int(args[4]) if action == "delay" else 0
        answer = None
        if action == "answer":
            status, code = int(args[4]), args[5]
            if not 400 <= status <= 599 or not re.fullmatch(r"[A-Za-z]+", code):
                raise ValueError("answer needs a status 400-599 and a code of letters")
            answer = (status, code)
        with LOCK:
            RULES.append(Rule(method, pattern, parse_nth(nth), action, ms, answer))
            return str(len(RULES) - 1)
    if cmd == "hits":
        with LOCK:
            return str(RULES[int(args[0])].hits)
    if cmd == "seen":
        with LOCK:
            return str(RULES[int(args[0])].seen)
    if cmd == "clear":
        with LOCK:
            # Ids stay valid: a cleared rule never matches again.
            for rule in RULES:
                rule.method = "\0"
        return ""
    raise ValueError(f"unknown request {cmd!r}")


def main():
    global UPSTREAM
    UPSTREAM = urllib.parse.urlsplit(sys.argv[1])
    if UPSTREAM.hostname != "127.0.0.1":
        raise SystemExit("the upstream must be on 127.0.0.1")
    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            try:
                print(f"ok {request(words)}".rstrip(), flush=True)
            except Exception as e:  # noqa: BLE001 - reported to the test, which fails
                print(f"err {type(e).__name__}: {e}".replace("\n", " "), flush=True)
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
