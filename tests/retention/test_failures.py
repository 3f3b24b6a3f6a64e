"""Failures: S3 down, a crash between upload and prune, and archives that must not be trusted."""

import contextlib
import hashlib
import io
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import OperationalError
from django.utils import timezone

from agentplatform.s3 import s3_client
from runs.agents import RetentionPolicy
from runs.retention import selectors, services, store
from runs.retention.envelope import ArchiveCorrupt, ArchiveKeyMismatch
from runs.retention.models import Archive
from tenants.models import TenantKey
from tests.retention.conftest import run_finished
from tests.retention.test_archive import hot_rows, without_archive


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def oldest_runs(count: int, *, days: int = 900, **kwargs):
    """Runs older than any other test's, so a pass (oldest first) takes them first."""
    return [run_finished(age=timedelta(days=days - i), **kwargs) for i in range(count)]


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
        unreachable = store.uploader_open()
    finally:
        settings.S3_ENDPOINT_URL = working
    real_put = store.object_put_verified

    def put_while_s3_goes_down(*, key, blob, uploader=None):
        # Uploads are concurrent: the outage reaches every upload but the first run's.
        return real_put(key=key, blob=blob,
                        uploader=uploader if str(first.id) in key else unreachable)

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


# -- what "verified" rests on: the store checks the upload's SHA-256, else it is read back -------
class Tampering:
    """A real client of the test S3 whose botocore events count its GETs and, asked to, do to
    its archive PUTs what a bad path or store could: flip a byte of the body on the way, after
    the request was signed (`flip`); drop the checksum from the store's answer (`hide`); or be
    a store that ignores the checksum and echoes it back (`echo`: the header is kept from the
    store, the probe's too, and the bytes it stores are not the ones sent)."""

    def __init__(self, *, flip=False, hide=False, echo=False):
        self.client, self.gets, self.sent = s3_client(), [], None
        self.flip, self.hide, self.echo = flip, hide, echo
        events = self.client.meta.events
        events.register("before-call.s3.GetObject", lambda **kwargs: self.gets.append(1))
        events.register("before-sign.s3.PutObject", self.before_sign)
        events.register("before-send.s3.PutObject", self.before_send)
        events.register("after-call.s3.PutObject", self.after_call)

    @staticmethod
    def flipped(body) -> io.BytesIO:
        data = bytearray(body.getvalue() if hasattr(body, "getvalue") else body)
        data[len(data) // 2] ^= 0x01
        return io.BytesIO(bytes(data))

    def before_sign(self, request, **kwargs):
        if self.echo:
            self.sent = request.headers["x-amz-checksum-sha256"]
            del request.headers["x-amz-checksum-sha256"]
            if not request.url.endswith(store.probe_key()):
                request.data = self.flipped(request.body).getvalue()

    def before_send(self, request, **kwargs):
        if self.flip and not request.url.endswith(store.probe_key()):
            request.body = self.flipped(request.body)

    def after_call(self, parsed, **kwargs):
        if self.hide:
            parsed.pop("ChecksumSHA256", None)
        if self.echo:
            parsed["ChecksumSHA256"] = self.sent

    def uploader(self):
        return store.uploader_open(client=self.client)


def test_an_upload_the_store_confirmed_is_not_read_back(s3):
    path = Tampering()
    uploader = path.uploader()
    assert uploader.store_checks  # SeaweedFS refused the probe's wrong checksum
    blob = b"an archive" * 500
    digest = store.object_put_verified(key="tenants/acme/archives/checked", blob=blob,
                                       uploader=uploader)
    assert digest == hashlib.sha256(blob).hexdigest() and path.gets == []
    assert store.object_get(key="tenants/acme/archives/checked") == blob


def test_bytes_changed_on_the_way_are_refused_by_the_store_and_nothing_is_stored(s3):
    with pytest.raises(ArchiveCorrupt, match="refused the upload"):
        store.object_put_verified(key="tenants/acme/archives/flipped", blob=b"x" * 4000,
                                  uploader=Tampering(flip=True).uploader())
    assert store.objects_under(prefix="tenants/acme/archives/flipped") == []


def test_a_store_that_does_not_confirm_the_checksum_gets_the_object_read_back(s3):
    path = Tampering(hide=True)
    blob = b"read me back" * 300
    assert store.object_put_verified(key="tenants/acme/archives/unconfirmed", blob=blob,
                                     uploader=path.uploader()) == hashlib.sha256(blob).hexdigest()
    assert path.gets == [1]


def test_a_store_that_echoes_the_checksum_unchecked_is_found_out_by_the_read_back(s3):
    path = Tampering(echo=True)
    uploader = path.uploader()
    assert not uploader.store_checks  # it took the probe's wrong checksum
    with pytest.raises(ArchiveCorrupt, match="read back"):
        store.object_put_verified(key="tenants/acme/archives/echoed", blob=b"y" * 4000,
                                  uploader=uploader)
    assert path.gets == [1]


def test_a_run_whose_upload_was_refused_stays_hot_and_the_next_pass_archives_it(
        archive_pass, monkeypatch, in_acme):
    run = oldest_runs(1)[0]
    before, live = hot_rows(run.id), selectors.run_history(run_id=run.id)
    flipping = Tampering(flip=True).uploader()
    monkeypatch.setattr(store, "uploader_open", lambda **kwargs: flipping)
    report = archive_pass()
    assert report.failed >= 1 and hot_rows(run.id) == before
    failed = Archive.objects.get(run_id=run.id)
    assert failed.status == "failed" and "refused the upload" in failed.error
    monkeypatch.undo()
    archive_pass()
    assert Archive.objects.get(run_id=run.id).status == "archived"
    assert set(hot_rows(run.id).values()) == {0}
    assert without_archive(services.archive_restore(tenant=in_acme, run_id=run.id)) == live


# -- a writer that outlives its pass (its locks gone: a frozen worker, a dropped session) --------
def stale_upload(run_id, rows):
    """What a pass that read the run's rows, then lost its transaction, uploads late."""
    version = TenantKey.objects.order_by("-version").values_list("version", flat=True).first()
    return services.run_upload(schema="acme", run_id=run_id, rows=rows, version=version,
                               uploader=store.uploader_open())


def test_a_late_upload_after_a_later_pass_recorded_the_archive_cannot_replace_it(
        archive_pass, in_acme):
    run, = oldest_runs(1)
    live, rows = selectors.run_history(run_id=run.id), selectors.runs_rows(run_ids=[run.id])[run.id]
    archive_pass()
    archive = Archive.objects.get(run_id=run.id)
    assert archive.status == "archived" and archive.object_key == store.object_key_for(
        schema="acme", run_id=run.id)

    late = stale_upload(run.id, rows)  # refused at the run's key: written beside it instead
    assert late.object_key != archive.object_key and late.sweep
    assert without_archive(services.archive_restore(tenant=in_acme, run_id=run.id)) == live


def test_every_failed_attempts_object_is_deleted_once_the_run_is_archived(
        archive_pass, monkeypatch, in_acme):
    run, = oldest_runs(1)
    live, rows = selectors.run_history(run_id=run.id), selectors.runs_rows(run_ids=[run.id])[run.id]
    stale_upload(run.id, rows)  # takes the run's key

    def crash(run_id):
        raise RuntimeError("worker died after the upload")

    monkeypatch.setattr(services, "after_upload", crash)
    archive_pass()
    archive_pass()  # two more attempts, each leaving an object beside the first
    assert len(objects_of(run.id)) == 3 and set(hot_rows(run.id).values()) != {0}
    monkeypatch.setattr(services, "after_upload", None)
    archive_pass()
    archive = Archive.objects.get(run_id=run.id)
    assert archive.status == "archived" and objects_of(run.id) == [archive.object_key]
    assert without_archive(services.archive_restore(tenant=in_acme, run_id=run.id)) == live


def test_a_store_that_replaces_objects_gets_a_key_per_upload_and_a_late_one_cannot_replace_it(
        archive_pass, monkeypatch, in_acme):
    run, = oldest_runs(1)
    live, rows = selectors.run_history(run_id=run.id), selectors.runs_rows(run_ids=[run.id])[run.id]
    client = s3_client()  # as a store that ignores If-None-Match: the header never reaches it
    client.meta.events.register("before-sign.s3.PutObject", lambda request, **kwargs: (
        request.headers.__delitem__("If-None-Match") if "If-None-Match" in request.headers
        else None))
    uploader = store.uploader_open(client=client)
    assert uploader.store_checks and not uploader.writes_once
    monkeypatch.setattr(store, "uploader_open", lambda **kwargs: uploader)
    archive_pass()
    archive = Archive.objects.get(run_id=run.id)
    assert archive.status == "archived"
    assert archive.object_key == store.object_key_for(schema="acme", run_id=run.id, blob=stored(
        archive.object_key))
    late = services.run_upload(schema="acme", run_id=run.id, rows=rows,
                               version=archive.key_version, uploader=uploader)
    assert late.object_key != archive.object_key
    assert without_archive(services.archive_restore(tenant=in_acme, run_id=run.id)) == live


def test_a_late_upload_that_landed_first_is_kept_aside_and_deleted_once_the_archive_commits(
        archive_pass, in_acme):
    run, = oldest_runs(1)
    live, rows = selectors.run_history(run_id=run.id), selectors.runs_rows(run_ids=[run.id])[run.id]
    early = stale_upload(run.id, rows)
    assert early.object_key == store.object_key_for(schema="acme", run_id=run.id)
    archive_pass()
    archive = Archive.objects.get(run_id=run.id)
    assert archive.status == "archived" and archive.object_key != early.object_key
    assert objects_of(run.id) == [archive.object_key]  # the early one, which nothing recorded
    assert without_archive(services.archive_restore(tenant=in_acme, run_id=run.id)) == live


def cut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class AnswerLost:
    """A TCP relay to the test S3 that, once, passes a PUT to a key matching `lost` on to the
    store and then cuts the connection instead of relaying the store's final answer: the
    object is stored, and the client, which never heard so, retries the PUT."""

    def __init__(self, target: str, lost) -> None:
        self.target, self.lost, self.dropped = target, lost, []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            host, port = self.target.split("//", 1)[1].split(":")
            upstream = socket.create_connection((host, int(port)))
            put = threading.Event()
            threading.Thread(target=self.requests, args=(client, upstream, put), daemon=True).start()
            threading.Thread(target=self.answers, args=(upstream, client, put), daemon=True).start()

    def requests(self, client, upstream, put) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if not self.dropped and data.startswith(b"PUT ") and self.lost(
                        data.split(b" ", 2)[1].decode()):
                    put.set()
                upstream.sendall(data)
        cut(upstream)

    def answers(self, upstream, client, put) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                if put.is_set() and not data.startswith(b"HTTP/1.1 100"):
                    self.dropped.append(data.split(b"\r\n", 1)[0].decode())
                    break  # the store's answer to the PUT, never relayed
                client.sendall(data)
        cut(client)  # at once: a close() alone waits for the other thread's recv()
        cut(upstream)

    def close(self) -> None:
        self.server.close()


def test_a_put_whose_answer_was_lost_is_retried_and_the_object_read_back(
        archive_pass, in_acme, settings):
    """The run's key holds an attempt's object, so the archive goes to a key named after its
    bytes; the store's answer to that PUT is lost, the client's retry is refused (the key
    holds these bytes now), and the object is read back and found to be them."""
    run, = oldest_runs(1)
    live, rows = selectors.run_history(run_id=run.id), selectors.runs_rows(run_ids=[run.id])[run.id]
    own = stale_upload(run.id, rows).object_key
    prefix = store.run_objects_prefix(schema="acme", run_id=run.id)
    relay = AnswerLost(settings.S3_ENDPOINT_URL,
                       lost=lambda path: prefix in path and not path.split("?")[0].endswith(own))
    endpoint, settings.S3_ENDPOINT_URL = settings.S3_ENDPOINT_URL, relay.url
    try:
        archive_pass()
    finally:
        settings.S3_ENDPOINT_URL = endpoint
        relay.close()
    assert [line.split(" ")[1] for line in relay.dropped] == ["200"]  # stored, answer lost
    archive = Archive.objects.get(run_id=run.id)
    assert archive.status == "archived" and archive.object_key not in (own, None)
    assert archive.object_key.startswith(prefix)
    assert objects_of(run.id) == [archive.object_key]  # the attempt's object swept
    assert without_archive(services.archive_restore(tenant=in_acme, run_id=run.id)) == live


def test_a_chunk_that_fails_mid_read_waits_for_its_uploads_before_it_lets_the_runs_go(
        in_acme, s3, monkeypatch):
    first, second = oldest_runs(2)
    real_put, real_rows, finished = store.object_put_verified, selectors.runs_rows, []

    def slow_put(**kwargs):  # a slow store: still writing when the chunk's next read fails
        time.sleep(0.5)
        digest = real_put(**kwargs)
        finished.append(kwargs["key"])
        return digest

    def rows(**kwargs):
        if str(second.id) in {str(run_id) for run_id in kwargs["run_ids"]}:
            raise OperationalError("the connection was lost mid-chunk")
        return real_rows(**kwargs)

    monkeypatch.setattr(store, "object_put_verified", slow_put)
    monkeypatch.setattr(selectors, "runs_rows", rows)
    monkeypatch.setattr(services, "ROWS_READ_AT_ONCE", 1)
    due = [(run.id, RetentionPolicy()) for run in (first, second)]
    with ThreadPoolExecutor(max_workers=2) as uploads:
        done = services.runs_archive(tenant=in_acme, due=due, uploads=uploads,
                                     uploader=store.uploader_open())
        assert set(done.failures) == {first.id, second.id}  # rolled back: both stay hot
        assert finished == [store.object_key_for(schema="acme", run_id=first.id)]


def test_a_store_that_refuses_every_upload_of_a_chunk_stops_the_pass_and_loses_nothing(
        archive_pass, monkeypatch, in_acme):
    first, second, third = oldest_runs(3, days=2000)  # older than what other tests leave hot
    before = {run.id: hot_rows(run.id) for run in (first, second, third)}
    flipping = Tampering(flip=True).uploader()  # every archive's bytes change on the way
    monkeypatch.setattr(store, "uploader_open", lambda **kwargs: flipping)
    monkeypatch.setattr(settings, "RETENTION_CHUNK_SIZE", 2)  # the oldest two, then the third
    report = archive_pass()
    assert "refused all 2 uploads of a chunk" in report.stopped
    assert report.failed == 2 and report.archived == 0
    assert [Archive.objects.get(run_id=run.id).status for run in (first, second)] == ["failed"] * 2
    assert not Archive.objects.filter(run_id=third.id).exists()  # never sealed nor sent
    assert {run.id: hot_rows(run.id) for run in (first, second, third)} == before
    monkeypatch.undo()
    report = archive_pass()
    assert report.stopped == ""
    assert {Archive.objects.get(run_id=run.id).status for run in (first, second, third)} == {
        "archived"}


@pytest.mark.parametrize("fates, stops", [
    (("refused", "refused"), True),
    (("refused", "refused", "archived"), False),  # the path took one: not it
    (("refused", "discarded"), False),  # one refusal: a byte flipped once
    (("refused", "refused", "crashed"), False),  # not every failure a refusal
    (("refused again", "refused again"), False),  # those runs' own bytes, again and again
])
def test_which_refusals_stop_the_pass(archive_pass, monkeypatch, in_acme, fates, stops):
    runs = oldest_runs(len(fates), days=2000)  # older than what other tests leave hot
    fate = dict(zip((str(run.id) for run in runs), fates, strict=True))
    for run_id, what in fate.items():
        if what == "discarded":
            services.run_retention_set(run_id=run_id, archive_required=False)
        if what == "refused again":  # an earlier pass's attempt failed
            services.archive_failure_record(run_id=run_id, error=store.UploadRefused("earlier"))
    flipping = Tampering(flip=True).uploader()
    real_put = store.object_put_verified

    def put(*, key, blob, uploader=None):
        refused = fate.get(key.rsplit("/", 1)[1].split(".")[0], "").startswith("refused")
        return real_put(key=key, blob=blob, uploader=flipping if refused else uploader)

    def after_upload(run_id):
        if fate.get(str(run_id)) == "crashed":
            raise RuntimeError("crashed after its upload")

    monkeypatch.setattr(store, "object_put_verified", put)
    monkeypatch.setattr(services, "after_upload", after_upload)
    monkeypatch.setattr(settings, "RETENTION_CHUNK_SIZE", len(fates))  # these runs, then others
    later = run_finished(age=timedelta(days=1000))  # due, in the next chunk
    report = archive_pass()
    assert ("refused all 2 uploads of a chunk" in report.stopped) is stops
    assert Archive.objects.filter(run_id=later.id, status="archived").exists() is not stops
    assert {str(a.run_id): a.status for a in Archive.objects.filter(run_id__in=fate)} == {
        run_id: {"refused": "failed", "refused again": "failed", "crashed": "failed"}.get(
            what, what) for run_id, what in fate.items()}
    monkeypatch.undo()
    archive_pass()  # not left hot for the next test's pass to take first
    assert not Archive.objects.filter(run_id__in=fate, status="failed").exists()


def test_runs_that_fail_every_pass_do_not_hold_back_the_runs_behind_them(archive_pass, in_acme):
    stuck = oldest_runs(4, days=3000)  # oldest of all: a pass used to take them first
    for run in stuck:
        services.archive_failure_record(run_id=run.id, error=store.UploadRefused("refused"))
    services.archive_failure_record(run_id=stuck[0].id, error=store.UploadRefused("again"))
    behind = oldest_runs(18, days=2500)
    # As of 2,000 days ago only these runs had finished 30 days (the TTL) before: no other
    # test's run is due then.
    then = timezone.now() - timedelta(days=2000)

    def due(limit: int) -> list:
        return [run_id for run_id, _ in selectors.runs_due(now=then, limit=limit)]

    # a tenth of the batch for them, fewest attempts first; the rest to the runs behind, oldest first
    assert due(20) == [run.id for run in behind] + [stuck[1].id, stuck[2].id]
    assert due(4) == [run.id for run in behind[:3]] + [stuck[1].id]
    # the room the runs behind leave goes to them too
    assert due(30) == [run.id for run in behind] + [run.id for run in stuck[1:] + stuck[:1]]
    archive_pass()  # nothing refuses now: all of them archived, none left hot for other tests
    assert not Archive.objects.filter(run_id__in=[r.id for r in stuck + behind]).exclude(
        status="archived").exists()
