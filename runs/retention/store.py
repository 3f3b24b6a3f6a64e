"""The archive store: S3 objects written and checked (by the store as it takes them, else read
back). Any S3 failure is one error, with a neutral message (it reaches the API and the Archive
row); the S3 detail, which names the internal endpoint, goes to the log for operators."""

import base64
import hashlib
import logging
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings

from agentplatform.s3 import s3_client

from .envelope import ArchiveCorrupt, ArchiveError

log = logging.getLogger("runs.retention.store")
UNAVAILABLE = "the archive store is unavailable; try again later"


class ArchiveStoreUnavailable(ArchiveError):
    code = "archive_store_unavailable"


# What a store answers when the bytes it received do not match the checksum the request
# carries: the x-amz-checksum-sha256 header, or the signed payload's hash (S3 signs it over TLS
# when a checksum header is given).
DIGEST_REFUSED = ("BadDigest", "XAmzContentSHA256Mismatch")
# ... and when a conditional PUT finds its key taken (AWS answers 409 to one racing another).
KEY_TAKEN = ("PreconditionFailed", "ConditionalRequestConflict")


def error_code(exc: ClientError) -> str | None:
    """The S3 error code a refused request came back with (BadDigest, NoSuchKey, ...)."""
    return exc.response.get("Error", {}).get("Code")


def probe_key() -> str:
    """Where `store_checks_sha256` probes: under the archives' prefix, outside every tenant's."""
    return f"{settings.RETENTION_S3_PREFIX}/.checksum-probe"


def object_key_for(*, schema: str, run_id, blob: bytes | None = None) -> str:
    """Where a run's archive goes: `<run id>.jsonl.gz.enc`, or, with `blob` (when an earlier
    attempt's object holds that key, or the store does not write once),
    `<run id>.<its sha256's first 16 hex>.jsonl.gz.enc`. `run_objects_prefix` holds both."""
    named = f"{hashlib.sha256(blob).hexdigest()[:16]}." if blob is not None else ""
    return f"{run_objects_prefix(schema=schema, run_id=run_id)}{named}jsonl.gz.enc"


def run_objects_prefix(*, schema: str, run_id) -> str:
    return f"{settings.RETENTION_S3_PREFIX}/{schema}/archives/{run_id}."


class UploadRefused(ArchiveCorrupt):
    """The store refused an upload: the bytes it received did not match the checksum sent."""


class ObjectExists(ArchiveError):
    """The key already holds an object: an archive object is written once, never replaced."""

    code = "archive_object_exists"


@dataclass(frozen=True)
class Uploader:
    """One S3 client for many uploads, shared by threads, and what its store was seen to do:
    check an upload's SHA-256 (`store_checks_sha256`), refuse to replace an object
    (`store_writes_once`)."""

    client: Any
    store_checks: bool
    writes_once: bool = True


def uploader_open(*, concurrency: int = 1, client=None) -> Uploader:
    """An uploader for up to `concurrency` threads (`client`: one of the caller's, else made)."""
    client = client or s3_client(max_pool_connections=max(10, concurrency))
    return Uploader(client, store_checks_sha256(client), store_writes_once(client))


def store_writes_once(client) -> bool:
    """Whether the store refuses a PUT with `If-None-Match: *` to a key that holds an object,
    as S3 and SeaweedFS do: a probe key of its own is written twice. One that takes both (it
    ignores the header), refuses the first, or cannot be asked now gets no conditional PUTs:
    each archive then goes to a key named after its bytes (`object_key_for(blob=)`)."""
    key = f"{probe_key()}-{uuid4().hex}"
    try:
        client.put_object(Bucket=settings.S3_BUCKET, Key=key, Body=b"probe", IfNoneMatch="*")
        try:
            client.put_object(Bucket=settings.S3_BUCKET, Key=key, Body=b"probe", IfNoneMatch="*")
            refused = False
        except ClientError as exc:
            refused = error_code(exc) in KEY_TAKEN
        client.delete_object(Bucket=settings.S3_BUCKET, Key=key)
    except (BotoCoreError, ClientError):
        return False
    if not refused:
        log.warning("the archive store replaced an object despite If-None-Match: each archive "
                    "goes to a key named after its bytes")
    return refused


def store_checks_sha256(client) -> bool:
    """Whether the store refuses a body whose `x-amz-checksum-sha256` does not match it, as S3
    and SeaweedFS do: a probe PUT with a wrong checksum must come back BadDigest. Only then is
    the checksum named in a PUT's answer taken as the store's check: a store that ignores the
    header, or only echoes it back, would name it over other bytes. One that takes the probe,
    or cannot be asked now, gets every archive read back instead."""
    wrong = base64.b64encode(hashlib.sha256(b"not the probe's body").digest()).decode()
    try:
        client.put_object(Bucket=settings.S3_BUCKET, Key=probe_key(), Body=b"checksum probe",
                          ChecksumSHA256=wrong)
    except ClientError as exc:
        return error_code(exc) in DIGEST_REFUSED
    except BotoCoreError:
        return False
    log.warning("the archive store took an upload whose SHA-256 did not match it: each archive "
                "is read back to verify it")
    try:
        client.delete_object(Bucket=settings.S3_BUCKET, Key=probe_key())
    except (BotoCoreError, ClientError):
        pass
    return False


def object_put_verified(*, key: str, blob: bytes, uploader: Uploader | None = None) -> str:
    """Upload and return the blob's sha256 once the stored bytes are known to be the uploaded
    ones. To a store that writes once (`uploader.writes_once`) the PUT is conditional
    (`If-None-Match: *`; ObjectExists if the key holds something: a writer that outlived its
    pass's locks cannot replace an archive a later pass recorded). The PUT carries the SHA-256
    (`x-amz-checksum-sha256`), which a store that checks (`uploader.store_checks`) compares with
    the bytes it received before storing them, refusing a mismatch (BadDigest), and names in its
    answer. Otherwise (the store does not check, or its answer does not name the checksum) the
    object is read back and compared. `uploader`: a shared one (`uploader_open()`), else one is
    made for this call."""
    raw = hashlib.sha256(blob).digest()
    digest, checksum = raw.hex(), base64.b64encode(raw).decode()
    uploader = uploader or uploader_open()
    once = {"IfNoneMatch": "*"} if uploader.writes_once else {}
    try:
        put = uploader.client.put_object(
            Bucket=settings.S3_BUCKET, Key=key, Body=blob, ContentType="application/octet-stream",
            ChecksumSHA256=checksum, Metadata={"sha256": digest}, **once)
    except ClientError as exc:
        if error_code(exc) in KEY_TAKEN:
            raise ObjectExists(f"{key}: the key already holds an object") from exc
        if error_code(exc) in DIGEST_REFUSED:
            raise UploadRefused(f"{key}: the store refused the upload: the bytes it received "
                                f"are not the {len(blob)} bytes sent") from exc
        log.warning("S3 could not store %s: %s", key, exc)
        raise ArchiveStoreUnavailable(UNAVAILABLE) from exc
    except BotoCoreError as exc:
        log.warning("S3 could not store %s: %s", key, exc)
        raise ArchiveStoreUnavailable(UNAVAILABLE) from exc
    if uploader.store_checks and put.get("ChecksumSHA256") == checksum:
        return digest
    return object_matches(key=key, blob=blob, uploader=uploader)


def object_matches(*, key: str, blob: bytes, uploader: Uploader) -> str:
    """The blob's sha256 if the object at `key` is the blob (read back), else ArchiveCorrupt."""
    try:
        stored = uploader.client.get_object(Bucket=settings.S3_BUCKET, Key=key)["Body"].read()
    except (BotoCoreError, ClientError) as exc:
        log.warning("S3 could not read %s back: %s", key, exc)
        raise ArchiveStoreUnavailable(UNAVAILABLE) from exc
    digest = hashlib.sha256(blob).hexdigest()
    if hashlib.sha256(stored).hexdigest() != digest:
        raise ArchiveCorrupt(f"{key}: the object read back ({len(stored)} bytes) is not the one "
                             f"uploaded ({len(blob)} bytes)")
    return digest


def objects_sweep(*, prefix: str, keep: str, client) -> None:
    """Delete the objects under `prefix` but `keep`, if the store can be reached now (else they
    stay): a run's objects that nothing refers to once its archive is recorded."""
    try:
        for key in objects_under(prefix=prefix, client=client):
            if key != keep:
                client.delete_object(Bucket=settings.S3_BUCKET, Key=key)
    except (BotoCoreError, ClientError) as exc:
        log.warning("S3 could not delete objects under %s that nothing refers to: %s", prefix, exc)


def object_get(*, key: str) -> bytes:
    try:
        return s3_client().get_object(Bucket=settings.S3_BUCKET, Key=key)["Body"].read()
    except ClientError as exc:
        if error_code(exc) in ("NoSuchKey", "404"):
            raise ArchiveCorrupt(f"{key}: the archive object is missing from the bucket") from exc
        log.warning("S3 could not read %s: %s", key, exc)
        raise ArchiveStoreUnavailable(UNAVAILABLE) from exc
    except BotoCoreError as exc:
        log.warning("S3 could not read %s: %s", key, exc)
        raise ArchiveStoreUnavailable(UNAVAILABLE) from exc


def objects_under(*, prefix: str, client=None) -> list[str]:
    """Keys under a prefix (operators' and tests' view of what is stored)."""
    keys, token = [], None
    client = client or s3_client()
    while True:
        page = client.list_objects_v2(Bucket=settings.S3_BUCKET, Prefix=prefix,
                                      **({"ContinuationToken": token} if token else {}))
        keys += [item["Key"] for item in page.get("Contents", [])]
        if not page.get("IsTruncated"):
            return keys
        token = page["NextContinuationToken"]
