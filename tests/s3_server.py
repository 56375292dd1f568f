"""A local S3-compatible server for the tests: moto's server on 127.0.0.1, on a port
the system picks, with a line protocol on standard input to set up and check objects
through boto3 (the reference client), and shut down when standard input closes.

    python tests/s3_server.py [--auth]

prints ``http://127.0.0.1:PORT KEY SECRET`` on its first line (the endpoint and the
credentials the server accepts), then answers each request line with one line,
``ok [VALUE]`` or ``err MESSAGE``:

    bucket NAME                  create a bucket
    put BUCKET KEY FILE          boto3 upload_file of FILE to BUCKET/KEY
    get BUCKET KEY FILE          boto3 download_file of BUCKET/KEY into FILE
    keys BUCKET [PREFIX]         the keys under PREFIX, space-separated, sorted
    meta BUCKET KEY NAME         the user metadata value NAME of BUCKET/KEY
    delete BUCKET KEY            delete one object
    served BUCKET                the bytes of every GET response body for BUCKET so far
                                 (what clients downloaded from it, ranges included)

Without ``--auth`` the server checks no signature (any key works). With it, the server
checks every request as AWS does: an IAM user with full S3 rights and an access key is
made first, and a request signed with any other key or secret is refused (403), so the
tests can show what a client does with bad credentials.

When standard input ends (the test process exited, however it ended) the server
stops, so no server outlives the tests that started it. Nothing here leaves loopback.
"""

import json
import os
import sys
import threading

# Credentials moto accepts when it checks no signature.
TEST_KEY = "testing"
# The requests moto serves unchecked before it starts checking signatures (--auth):
# exactly the three that make the test user (create_user, put_user_policy,
# create_access_key). moto reads this when it is imported, so it is set before.
SETUP_REQUESTS = 3
AUTH = "--auth" in sys.argv[1:]
if AUTH:
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = str(SETUP_REQUESTS)

import boto3  # noqa: E402
from moto.moto_server import threaded_moto_server as tms  # noqa: E402

# Bytes of GET response bodies by bucket (path-style requests: /BUCKET/KEY).
SERVED = {}
SERVED_LOCK = threading.Lock()


def counting(app):
    """The WSGI app ``app`` adding the body bytes of each GET response to SERVED."""

    def wrapped(environ, start_response):
        body = app(environ, start_response)
        if environ.get("REQUEST_METHOD") != "GET":
            return body
        bucket = environ.get("PATH_INFO", "/").lstrip("/").split("/", 1)[0]

        def counted():
            n = 0
            try:
                for chunk in body:
                    n += len(chunk)
                    yield chunk
            finally:
                with SERVED_LOCK:
                    SERVED[bucket] = SERVED.get(bucket, 0) + n
                close = getattr(body, "close", None)
                if close is not None:
                    close()

        return counted()

    return wrapped


class CountingServer(tms.ThreadedMotoServer):
    """moto's threaded server with its app wrapped by ``counting``."""

    def _server_entry(self):
        app = counting(tms.DomainDispatcherApplication(tms.create_backend_app))
        self._server = tms.make_server(self._ip_address, self._port, app, True,
                                       request_handler=tms.MotoRequestHandler)
        self._server_ready_event.set()
        self._server.serve_forever()

# The policy of the test user: everything on S3.
S3_ALL = json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
)


def client(url, key=TEST_KEY, secret=TEST_KEY, service="s3"):
    return boto3.client(
        service,
        endpoint_url=url,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
    )


def make_user(url):
    """The IAM user the --auth server accepts, and its access key and secret."""
    iam = client(url, service="iam")
    iam.create_user(UserName="tlio-test")
    iam.put_user_policy(UserName="tlio-test", PolicyName="s3-all", PolicyDocument=S3_ALL)
    key = iam.create_access_key(UserName="tlio-test")["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


def answer(s3, words):
    cmd, args = words[0], words[1:]
    if cmd == "bucket":
        s3.create_bucket(Bucket=args[0])
        return ""
    if cmd == "put":
        s3.upload_file(args[2], args[0], args[1])
        return ""
    if cmd == "get":
        s3.download_file(args[0], args[1], args[2])
        return ""
    if cmd == "keys":
        prefix = args[1] if len(args) > 1 else ""
        keys = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=args[0], Prefix=prefix):
            keys.extend(o["Key"] for o in page.get("Contents", []))
        return " ".join(sorted(keys))
    if cmd == "meta":
        head = s3.head_object(Bucket=args[0], Key=args[1])
        return head.get("Metadata", {}).get(args[2], "")
    if cmd == "delete":
        s3.delete_object(Bucket=args[0], Key=args[1])
        return ""
    if cmd == "served":
        with SERVED_LOCK:
            return str(SERVED.get(args[0], 0))
    raise ValueError(f"unknown request {cmd!r}")


def main():
    server = CountingServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    key, secret = make_user(url) if AUTH else (TEST_KEY, TEST_KEY)
    print(url, key, secret, flush=True)
    s3 = client(url, key, secret)
    try:
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            try:
                value = answer(s3, words)
                print(f"ok {value}".rstrip(), flush=True)
            except Exception as e:  # noqa: BLE001 - reported to the test, which fails
                print(f"err {type(e).__name__}: {e}".replace("\n", " "), flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
