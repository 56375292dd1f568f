"""The local S3 server the object-storage tests run against behaves as the protocol
needs: it is on loopback, a conditional create of an existing key is refused (412),
and a conditional replace with a stale entity tag is refused too."""

import botocore.exceptions
import pytest


def test_server_is_on_loopback_and_the_fixture_points_the_environment_at_it(s3, monkeypatch):
    import os

    assert s3.endpoint.startswith("http://127.0.0.1:")
    assert os.environ["AWS_ENDPOINT_URL"] == s3.endpoint
    assert "AWS_SESSION_TOKEN" not in os.environ
    assert s3.url("a/b") == f"s3://{s3.name}/a/b"
    assert s3.keys() == []


def test_conditional_writes_are_honoured(s3):
    c = s3.client
    c.put_object(Bucket=s3.name, Key="k", Body=b"one", IfNoneMatch="*")
    with pytest.raises(botocore.exceptions.ClientError) as e:
        c.put_object(Bucket=s3.name, Key="k", Body=b"two", IfNoneMatch="*")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    etag = c.head_object(Bucket=s3.name, Key="k")["ETag"]
    c.put_object(Bucket=s3.name, Key="k", Body=b"three", IfMatch=etag)
    with pytest.raises(botocore.exceptions.ClientError) as e:
        c.put_object(Bucket=s3.name, Key="k", Body=b"four", IfMatch=etag)
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert c.get_object(Bucket=s3.name, Key="k")["Body"].read() == b"three"
    assert s3.keys() == ["k"]
