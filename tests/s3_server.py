"""A local S3-compatible server for the tests: moto's server on 127.0.0.1, on a port
the system picks, with a line protocol on standard input to set up and check objects
through boto3 (the reference client), and shut down when standard input closes.

    python tests/s3_server.py

prints ``http://127.0.0.1:PORT`` on its first line, then answers each request line
with one line, ``ok [VALUE]`` or ``err MESSAGE``:

    bucket NAME                  create a bucket
    put BUCKET KEY FILE          boto3 upload_file of FILE to BUCKET/KEY
    get BUCKET KEY FILE          boto3 download_file of BUCKET/KEY into FILE
    keys BUCKET [PREFIX]         the keys under PREFIX, space-separated, sorted
    meta BUCKET KEY NAME         the user metadata value NAME of BUCKET/KEY
    delete BUCKET KEY            delete one object

When standard input ends (the test process exited, however it ended) the server
stops, so no server outlives the tests that started it. Nothing here leaves loopback.
"""

import sys

import boto3
from moto.server import ThreadedMotoServer

# Credentials moto accepts; the server checks no signature unless told to.
TEST_KEY = "testing"


def client(url):
    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=TEST_KEY,
        aws_secret_access_key=TEST_KEY,
        region_name="us-east-1",
    )


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
    raise ValueError(f"unknown request {cmd!r}")


def main():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    print(url, flush=True)
    s3 = client(url)
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
