"""The archive store: S3 objects written and checked (by the store as it takes them, else read
back). Any S3 failure is one error, with a neutral message (it reaches the API and the Archive
row); the S3 detail, which names the internal endpoint, goes to the log for operators."""

import base64
import hashlib
import logging

from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings

from agentplatform.s3 import s3_client

from .envelope import ArchiveCorrupt, ArchiveError

log = logging.getLogger("runs.retention.store")
UNAVAILABLE = "the archive store is unavailable; try again later"


class ArchiveStoreUnavailable(ArchiveError):
    code = "archive_store_unavailable"


def object_key_for(*, schema: str, run_id) -> str:
    return f"{settings.RETENTION_S3_PREFIX}/{schema}/archives/{run_id}.jsonl.gz.enc"


def shared_client(*, concurrency: int = 1):
    """One S3 client for many requests, shared by up to `concurrency` threads."""
    return s3_client(max_pool_connections=max(10, concurrency))


def object_put_verified(*, key: str, blob: bytes, client=None) -> str:
    """Upload and return the blob's sha256 once the stored bytes are known to be the uploaded
    ones: the PUT carries the SHA-256 (`x-amz-checksum-sha256`), which S3 checks against the
    bytes it received before it stores them, refusing a mismatch (BadDigest), and names in its
    answer. A store whose answer does not name that checksum (one that ignores the header) gets
    the object read back and compared instead. `client`: a shared one (`shared_client()`), else
    one is made for this call."""
    raw = hashlib.sha256(blob).digest()
    digest, checksum = raw.hex(), base64.b64encode(raw).decode()
    client = client or s3_client()
    try:
        put = client.put_object(Bucket=settings.S3_BUCKET, Key=key, Body=blob,
                                ContentType="application/octet-stream", ChecksumSHA256=checksum,
                                Metadata={"sha256": digest})
        if put.get("ChecksumSHA256") == checksum:  # checked by the store as it took the bytes
            return digest
        stored = client.get_object(Bucket=settings.S3_BUCKET, Key=key)["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "BadDigest":
            raise ArchiveCorrupt(f"{key}: the store refused the upload: the bytes it received "
                                 f"are not the {len(blob)} bytes sent") from exc
        log.warning("S3 could not store %s: %s", key, exc)
        raise ArchiveStoreUnavailable(UNAVAILABLE) from exc
    except BotoCoreError as exc:
        log.warning("S3 could not store %s: %s", key, exc)
        raise ArchiveStoreUnavailable(UNAVAILABLE) from exc
    if hashlib.sha256(stored).hexdigest() != digest:
        raise ArchiveCorrupt(f"{key}: the object read back ({len(stored)} bytes) is not the one "
                             f"uploaded ({len(blob)} bytes)")
    return digest


def object_get(*, key: str) -> bytes:
    try:
        return s3_client().get_object(Bucket=settings.S3_BUCKET, Key=key)["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            raise ArchiveCorrupt(f"{key}: the archive object is missing from the bucket") from exc
        log.warning("S3 could not read %s: %s", key, exc)
        raise ArchiveStoreUnavailable(UNAVAILABLE) from exc
    except BotoCoreError as exc:
        log.warning("S3 could not read %s: %s", key, exc)
        raise ArchiveStoreUnavailable(UNAVAILABLE) from exc


def objects_under(*, prefix: str) -> list[str]:
    """Keys under a prefix (operators' and tests' view of what is stored)."""
    keys, token = [], None
    client = s3_client()
    while True:
        page = client.list_objects_v2(Bucket=settings.S3_BUCKET, Prefix=prefix,
                                      **({"ContinuationToken": token} if token else {}))
        keys += [item["Key"] for item in page.get("Contents", [])]
        if not page.get("IsTruncated"):
            return keys
        token = page["NextContinuationToken"]
