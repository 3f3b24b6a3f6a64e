"""Every query parameter of every list is validated, and what the API reads from a body is what
the schema says: a bad one is a 400 in the API's error shape that names it, never a 500 and never
a silently unfiltered list (docs/decisions/0016-api-contract.md)."""

import base64

import pytest
from django.test import Client

from runs.services import run_start


@pytest.fixture
def acme_run_id(in_acme):
    return run_start(agent="research", input={"topic": "filters"}, enqueue=False).run.id


BAD_FILTERS = [
    ("/api/v1/runs?status=bogus", "status"),
    ("/api/v1/runs?status=queued,bogus", "status"),
    ("/api/v1/runs?status=", "status"),
    ("/api/v1/runs?agent=" + "a" * 101, "agent"),
    ("/api/v1/runs?agent=%00", "agent"),
    ("/api/v1/runs?limit=abc", "limit"),
    ("/api/v1/runs?limit=0", "limit"),
    ("/api/v1/runs?limit=501", "limit"),
    ("/api/v1/runs?stauts=failed", "stauts"),
    ("/api/v1/approvals?run=nope", "run"),
    ("/api/v1/approvals?status=bogus", "status"),
    ("/api/v1/approvals?limit=-1", "limit"),
    ("/api/v1/outbox?run=nope", "run"),
    ("/api/v1/outbox?status=bogus", "status"),
    ("/api/v1/outbox?run=", "run"),
    ("/api/v1/runs/{run}/events?limit=1001", "limit"),
    ("/api/v1/runs/{run}/events?kind=step_error", "kind"),
    ("/api/v1/runs/{run}/checkpoints?limit=x", "limit"),
]


@pytest.mark.parametrize(("path", "parameter"), BAD_FILTERS)
def test_a_bad_query_parameter_is_400_invalid_filter_naming_it(acme_api, acme_run_id, path,
                                                               parameter):
    answer = acme_api.get(path.format(run=acme_run_id))
    assert answer.status_code == 400, answer.content
    error = answer.json()["error"]
    assert error["code"] == "invalid_filter"
    assert parameter in error["fields"] and parameter in error["message"]


def test_good_filters_and_pages_still_answer(acme_api, acme_run_id):
    listed = acme_api.get("/api/v1/runs?status=queued,running&agent=research&limit=1")
    assert listed.status_code == 200
    assert [run["id"] for run in listed.json()["results"]] == [str(acme_run_id)]
    following = acme_api.get(listed.json()["next"]) if listed.json()["next"] else None
    assert following is None or following.status_code == 200
    assert acme_api.get(f"/api/v1/approvals?run={acme_run_id}&status=pending").status_code == 200
    assert acme_api.get(f"/api/v1/runs/{acme_run_id}/events?limit=1").status_code == 200


def test_a_nul_character_in_a_body_is_refused_not_a_500(acme_api):
    answer = acme_api.post("/api/v1/events", {"kind": "docs.signed", "key": "ada@acme.com",
                                              "payload": {"note": ["fine", "not\u0000fine"]}},
                           format="json")
    assert answer.status_code == 400, answer.content
    assert "U+0000" in answer.json()["error"]["message"]


def test_a_number_where_the_schema_says_string_is_refused(acme_api):
    answer = acme_api.post("/api/v1/events", {"kind": "docs.signed", "key": 5}, format="json")
    assert answer.status_code == 400
    assert answer.json()["error"]["fields"] == {"key": ["Not a valid string."]}


def test_a_form_body_is_unsupported_the_api_reads_json(acme_api):
    answer = acme_api.post("/api/v1/events", {"kind": "docs.signed", "key": "ada@acme.com"})
    assert answer.status_code == 415
    assert answer.json()["error"]["code"] == "unsupported_media_type"


@pytest.mark.parametrize("path", ["/api/v1/runs/5b2f1c1e-0c4e-4d0e-9f3a-2f6f3c1d9e7ax",
                                  "/api/v1/no-such-thing", "/api/v1/approvals/null%2Cnull/decide"])
def test_a_path_under_the_api_that_matches_nothing_is_404_in_the_error_shape(acme_api, path):
    answer = acme_api.get(path)
    assert answer.status_code == 404
    assert answer["Content-Type"] == "application/json"
    assert answer.json() == {"error": {"code": "not_found", "message": "No such path."}}


def test_starting_a_run_of_an_agent_that_is_not_registered_is_404_unknown_agent(acme_api):
    for body in ({"agent": "no-such-agent"}, {"agent": "research", "version": 999}):
        answer = acme_api.post("/api/v1/runs", body, format="json")
        assert answer.status_code == 404, body
        assert answer.json()["error"]["code"] == "unknown_agent"


def forged_cursor(position: str) -> str:
    return base64.b64encode(f"o=0&r=0&p={position}".encode()).decode()


@pytest.mark.parametrize(("path", "position"), [
    ("/api/v1/runs", "notadate"), ("/api/v1/approvals", "notadate"),
    ("/api/v1/outbox", "2026-13-45"), ("/api/v1/runs/{run}/events", "x"),
    ("/api/v1/runs/{run}/checkpoints", "x"),
    ("/api/v1/runs/{run}/checkpoints", "99999999999999999999999"),
])
def test_a_cursor_whose_position_is_no_value_of_the_ordering_is_404(acme_api, acme_run_id, path,
                                                                    position):
    acme_api.raise_request_exception = False
    answer = acme_api.get(f"{path.format(run=acme_run_id)}?cursor={forged_cursor(position)}")
    assert answer.status_code == 404, answer.content[:300]
    assert answer.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/api/v1/credentials/stripe/a%00b"), ("GET", "/api/v1/credentials/st%00ripe/default"),
    ("DELETE", "/api/v1/credentials/stripe/a%00b"),
    ("GET", "/api/v1/credentials/stripe/" + "a" * 5000),
    ("GET", "/api/v1/credentials/no-such-connector/default"),
    ("DELETE", "/api/v1/credentials/no-such-connector/default"),
])
def test_a_credential_path_no_credential_can_have_is_404(acme_api, method, path):
    acme_api.raise_request_exception = False
    answer = acme_api.generic(method, path, '{"secrets": {"k": "v"}}',
                              content_type="application/json")
    assert answer.status_code == 404, answer.content[:300]
    assert answer.json()["error"]["code"] == "not_found"


def test_writing_a_credential_under_a_label_no_credential_can_have_is_400(acme_api):
    acme_api.raise_request_exception = False
    answer = acme_api.put("/api/v1/credentials/stripe/a%00b", {"secrets": {"k": "v"}}, format="json")
    assert answer.status_code == 400, answer.content[:300]
    assert answer.json()["error"]["code"] == "invalid_label"


@pytest.mark.parametrize("key", ["a\x00b", "caf\xe9", "\xe9" * 255, "tab\there"])
def test_an_idempotency_key_that_is_not_printable_ascii_is_400(acme_api, key):
    acme_api.raise_request_exception = False
    answer = acme_api.post("/api/v1/runs", {"agent": "research"}, format="json",
                           HTTP_IDEMPOTENCY_KEY=key)
    assert answer.status_code == 400, answer.content[:300]
    assert answer.json()["error"]["code"] == "invalid_idempotency_key"


def test_what_django_refuses_before_a_view_is_json_under_the_api_and_html_in_the_admin(acme_api):
    acme_api.raise_request_exception = False
    many = "&".join(f"a{i}=1" for i in range(1100))  # over DATA_UPLOAD_MAX_NUMBER_FIELDS
    for answer in (acme_api.get("/api/v1/runs?" + many),
                   acme_api.get("/api/v1/runs", HTTP_HOST="evil.example")):
        assert answer.status_code == 400
        assert answer["Content-Type"] == "application/json", answer.content[:200]
        assert answer.json()["error"]["code"] == "bad_request"
    admin = Client(raise_request_exception=False).get("/admin/login/", HTTP_HOST="evil.example")
    assert admin.status_code == 400 and admin["Content-Type"].startswith("text/html")


def test_the_schema_views_errors_are_json(acme_api):
    client = Client(raise_request_exception=False)
    for answer, status in ((client.get("/api/v1/schema?format=bogus"), 404),
                           (client.post("/api/v1/schema", {}), 405)):
        assert answer.status_code == status
        assert answer["Content-Type"] == "application/json", answer.content[:200]
        assert "code" in answer.json()["error"]
    assert client.get("/api/v1/schema").status_code == 200
