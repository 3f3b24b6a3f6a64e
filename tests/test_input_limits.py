"""Input limits in the API's own error shape: a body over REQUEST_MAX_BYTES is 413
request_too_large (not Django's HTML page), a JSON body nested over API_JSON_MAX_DEPTH is 400
json_too_deep (not a 500)."""

import json
import uuid

from django.core.exceptions import RequestDataTooBig
from django.test import override_settings

from agentplatform import api_errors
from tests.support.api import api_client


def error_of(response):
    assert response["Content-Type"].startswith("application/json"), response.content[:200]
    return response.status_code, response.json()["error"]["code"]


def nested(depth: int):
    value = "leaf"
    for _ in range(depth):
        value = {"n": value}
    return value


def test_a_30_mb_body_is_413_in_the_api_shape(acme_api):
    body = json.dumps({"agent": "research", "input": {"blob": "x" * (30 * 1024 * 1024)}})
    response = acme_api.post("/api/v1/runs", body, content_type="application/json")
    assert error_of(response) == (413, "request_too_large")


def test_the_size_limit_is_checked_before_the_key(acme_api):
    response = api_client(None).post("/api/v1/events", "x" * (2 * 1024 * 1024),
                                     content_type="application/json")
    assert error_of(response) == (413, "request_too_large")


def test_a_webhook_body_over_the_limit_is_413_in_the_api_shape():
    response = api_client(None).post(f"/webhooks/slack/{uuid.uuid4()}/events",
                                     "x" * (2 * 1024 * 1024), content_type="application/json")
    assert error_of(response) == (413, "request_too_large")


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=4096)
def test_the_limit_is_a_setting(acme_api):
    small = acme_api.post("/api/v1/runs", {"agent": "no-such-agent"}, format="json")
    assert error_of(small) == (404, "unknown_agent")
    big = acme_api.post("/api/v1/runs", {"agent": "no-such-agent", "input": {"x": "y" * 5000}},
                        format="json")
    assert error_of(big) == (413, "request_too_large")


def test_a_body_read_past_the_limit_elsewhere_is_413_too():
    response = api_errors.exception_handler(RequestDataTooBig("too big"), {})
    assert response.status_code == 413
    assert response.data["error"]["code"] == "request_too_large"


def test_a_deeply_nested_body_is_400_not_500(acme_api):
    for body in ["[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000]:
        response = acme_api.post("/api/v1/events", body, content_type="application/json")
        assert error_of(response) == (400, "json_too_deep")


def test_nesting_over_the_depth_limit_is_400_and_under_it_is_accepted(acme_api):
    too_deep = acme_api.post("/api/v1/runs", {"agent": "research", "input": nested(40)},
                             format="json")
    assert error_of(too_deep) == (400, "json_too_deep")
    assert "32" in too_deep.json()["error"]["message"]
    fine = acme_api.post("/api/v1/events", {"kind": "docs.nested", "key": str(uuid.uuid4()),
                                            "payload": nested(20)}, format="json")
    assert fine.status_code == 202, fine.content


def test_numbers_a_double_cannot_hold_and_lone_surrogates_are_400_not_500(acme_api):
    acme_api.raise_request_exception = False
    for body in ['{"kind":"docs.x","key":"k","payload":{"x":1e400}}',
                 '{"kind":"docs.x","key":"k","payload":{"x":[-1e999]}}',
                 '{"kind":"docs.x","key":"k","payload":{"x":"\\ud800"}}',
                 '{"kind":"docs.x","key":"\\udfff","payload":{}}',
                 '{"kind":"docs.x","key":"k","payload":{"\\udbff":1}}']:
        response = acme_api.post("/api/v1/events", body, content_type="application/json")
        assert error_of(response) == (400, "parse_error"), body
    run = acme_api.post("/api/v1/runs", '{"agent":"research","input":{"q":"\\ud800"}}',
                        content_type="application/json")
    assert error_of(run) == (400, "parse_error")
    body = '{"kind":"docs.x","key":"KEY","payload":{"x":"\\ud83d\\ude00","big":1e300}}'
    paired = acme_api.post("/api/v1/events", body.replace("KEY", str(uuid.uuid4())),
                           content_type="application/json")
    assert paired.status_code == 202, paired.content  # a pair is one character: stored
