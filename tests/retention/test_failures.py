"""Failures: S3 down, a crash between upload and prune, and archives that must not be trusted."""

import socket
from datetime import timedelta

import pytest
from django.conf import settings

from agentplatform.s3 import s3_client
from runs.retention import selectors, services, store
from runs.retention.envelope import ArchiveCorrupt, ArchiveKeyMismatch
from runs.retention.models import Archive
from tests.retention.conftest import run_finished
from tests.retention.test_archive import hot_rows, without_archive


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def oldest_runs(count: int, **kwargs):
    """Runs older than any other test's, so a pass (oldest first) takes them first."""
    return [run_finished(age=timedelta(days=900 - i), **kwargs) for i in range(count)]


def objects_of(run_id) -> list[str]:
    return [key for key in store.objects_under(prefix="tenants/acme/archives/") if str(run_id) in key]


def test_s3_down_mid_job_prunes_nothing_more_and_a_later_pass_completes(archive_pass, monkeypatch,
                                                                       in_acme):
    first, second, third = runs = oldest_runs(3)
    histories = {run.id: selectors.run_history(run_id=run.id) for run in runs}
    before = {run.id: hot_rows(run.id) for run in runs}
    working = settings.S3_ENDPOINT_URL
    settings.S3_ENDPOINT_URL = f"http://127.0.0.1:{closed_port()}"
    try:
        unreachable = s3_client()
    finally:
        settings.S3_ENDPOINT_URL = working
    real_put = store.object_put_verified

    def put_while_s3_goes_down(*, key, blob, client=None):
        # Uploads are concurrent: the outage reaches every upload but the first run's.
        return real_put(key=key, blob=blob, client=client if str(first.id) in key else unreachable)

    monkeypatch.setattr(store, "object_put_verified", put_while_s3_goes_down)
    monkeypatch.setattr(settings, "RETENTION_CHUNK_SIZE", 2)  # first and second, then third
    report = archive_pass()
    monkeypatch.setattr(store, "object_put_verified", real_put)

    assert Archive.objects.get(run_id=first.id).status == "archived"  # uploaded before the outage
    assert "archive store is unavailable" in report.stopped and report.failed == 1
    for run in (second, third):
        assert hot_rows(run.id) == before[run.id]
    failed = Archive.objects.get(run_id=second.id)
    assert failed.status == "failed" and failed.attempts == 1
    assert "ArchiveStoreUnavailable" in failed.error and "127.0.0.1" not in failed.error
    assert not Archive.objects.filter(run_id=third.id).exists()

    report = archive_pass()

    assert report.failed == 0
    for run in runs:
        archive = Archive.objects.get(run_id=run.id)
        assert archive.status == "archived" and archive.error == ""
        assert set(hot_rows(run.id).values()) == {0}
        assert objects_of(run.id) == [archive.object_key]
        assert without_archive(services.archive_restore(tenant=in_acme, run_id=run.id)) \
            == histories[run.id]


def test_crash_between_upload_and_prune_reruns_to_one_archive(archive_pass, monkeypatch, in_acme):
    run, = oldest_runs(1)
    history, before = selectors.run_history(run_id=run.id), hot_rows(run.id)

    def crash(run_id):
        raise RuntimeError("worker died after the upload")

    monkeypatch.setattr(services, "after_upload", crash)
    archive_pass()
    assert hot_rows(run.id) == before  # the prune rolled back with the Archive row
    assert Archive.objects.get(run_id=run.id).status == "failed"
    assert len(objects_of(run.id)) == 1  # uploaded, not yet recorded

    monkeypatch.setattr(services, "after_upload", None)
    archive_pass()

    assert Archive.objects.filter(run_id=run.id).count() == 1
    assert Archive.objects.get(run_id=run.id).status == "archived"
    assert objects_of(run.id) == [Archive.objects.get(run_id=run.id).object_key]
    assert set(hot_rows(run.id).values()) == {0}
    assert without_archive(services.archive_restore(tenant=in_acme, run_id=run.id)) == history


@pytest.fixture
def archived(archive_pass, in_acme):
    run, = oldest_runs(1)
    archive_pass()
    return Archive.objects.get(run_id=run.id)


def overwrite(key: str, blob: bytes) -> None:
    s3_client().put_object(Bucket=settings.S3_BUCKET, Key=key, Body=blob)


def stored(key: str) -> bytes:
    return s3_client().get_object(Bucket=settings.S3_BUCKET, Key=key)["Body"].read()


def test_a_flipped_byte_is_refused(archived, in_acme, acme_api):
    blob = bytearray(stored(archived.object_key))
    blob[len(blob) // 2] ^= 0x01
    overwrite(archived.object_key, bytes(blob))
    with pytest.raises(ArchiveCorrupt, match="sha256 .* does not match .* altered"):
        services.archive_restore(tenant=in_acme, run_id=archived.run_id)
    response = acme_api.get(f"/api/v1/runs/{archived.run_id}/archive")
    assert response.status_code == 500 and response.json()["error"]["code"] == "archive_corrupt"


def test_a_flipped_byte_is_refused_even_if_the_recorded_digest_was_changed_too(archived, in_acme):
    import hashlib

    blob = bytearray(stored(archived.object_key))
    blob[-20] ^= 0x80
    overwrite(archived.object_key, bytes(blob))
    Archive.objects.filter(pk=archived.pk).update(sha256=hashlib.sha256(blob).hexdigest())
    with pytest.raises(ArchiveCorrupt, match="fails authentication"):
        services.archive_restore(tenant=in_acme, run_id=archived.run_id)


def test_a_truncated_object_is_refused(archived, in_acme):
    overwrite(archived.object_key, stored(archived.object_key)[:-100])
    with pytest.raises(ArchiveCorrupt, match="truncated"):
        services.archive_restore(tenant=in_acme, run_id=archived.run_id)


def test_another_runs_object_in_its_place_is_refused(archive_pass, in_acme):
    one, other = oldest_runs(2)
    archive_pass()
    mine, theirs = (Archive.objects.get(run_id=run.id) for run in (one, other))
    overwrite(mine.object_key, stored(theirs.object_key))
    Archive.objects.filter(pk=mine.pk).update(sha256=theirs.sha256, size=theirs.size)
    with pytest.raises(ArchiveKeyMismatch):
        services.archive_restore(tenant=in_acme, run_id=one.id)


def test_another_tenants_key_cannot_open_the_archive(archived, globex):
    with pytest.raises(ArchiveKeyMismatch, match="tenant globex cannot open"):
        services.archive_read(archive=archived, tenant=globex)


def test_another_tenants_api_gets_404_for_the_archive(archived, globex_api, acme_api):
    assert acme_api.get(f"/api/v1/runs/{archived.run_id}/archive").status_code == 200
    response = globex_api.get(f"/api/v1/runs/{archived.run_id}/archive")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_an_unreachable_store_answers_503_without_naming_the_internal_endpoint(
        archive_pass, in_acme, acme_api, globex_api, caplog):
    run = run_finished()
    archive_pass()
    assert Archive.objects.get(run_id=run.id).status == "archived"
    working, down = settings.S3_ENDPOINT_URL, f"http://127.0.0.1:{closed_port()}"
    settings.S3_ENDPOINT_URL = down
    try:
        with caplog.at_level("WARNING", logger="runs.retention.store"):
            answer = acme_api.get(f"/api/v1/runs/{run.id}/archive")
        other = globex_api.get(f"/api/v1/runs/{run.id}/archive")
    finally:
        settings.S3_ENDPOINT_URL = working
    assert answer.status_code == 503
    error = answer.json()["error"]
    assert error["code"] == "archive_store_unavailable"
    assert error["message"] == "the archive store is unavailable; try again later"
    assert "127.0.0.1" not in answer.content.decode() and "http" not in error["message"]
    assert down.split("//")[1] in caplog.text  # the operators' log has the detail
    assert other.status_code == 404  # globex: no such archive, store up or down
