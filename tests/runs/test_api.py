"""The runs REST API: create (idempotent), read, list, events, checkpoints, state, fork, cancel."""

import uuid

from tests.support.api import api_client
from tests.support.waiting import wait_for


def test_create_with_idempotency_key_returns_the_same_run(acme_api):
    key = str(uuid.uuid4())
    body = {"agent": "research", "input": {"topic": "kelp", "iterations": 2}}
    first = acme_api.post("/api/v1/runs", body, format="json", HTTP_IDEMPOTENCY_KEY=key)
    again = acme_api.post("/api/v1/runs", body, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    other = acme_api.post("/api/v1/runs", {**body, "input": {"topic": "other"}}, format="json",
                          HTTP_IDEMPOTENCY_KEY=key)
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "idempotency_key_reused"


def test_bad_requests_get_json_errors_with_a_code(acme_api):
    cases = [
        ({"agent": "no-such-agent"}, 404, "unknown_agent"),  # no such agent: 0016
        ({"input": {}}, 400, "invalid_request"),
        ({"agent": "research", "durability": "sometimes"}, 400, "invalid_request"),
        ({"agent": "research", "max_steps": 0}, 400, "invalid_request"),
        ({"agent": "research", "input": "not an object"}, 400, "invalid_request"),
    ]
    for body, status, code in cases:
        response = acme_api.post("/api/v1/runs", body, format="json")
        assert response.status_code == status, (body, response.content)
        assert response.json()["error"]["code"] == code, body
    malformed = acme_api.post("/api/v1/runs", "{not json", content_type="application/json")
    assert malformed.status_code == 400 and "error" in malformed.json()
    assert acme_api.get(f"/api/v1/runs/{uuid.uuid4()}").status_code == 404
    assert acme_api.get("/api/v1/runs?status=bogus").json()["error"]["code"] == "invalid_filter"


def test_a_run_goes_through_the_api_end_to_end(acme_api, worker):
    created = acme_api.post("/api/v1/runs", {"agent": "research",
                                             "input": {"topic": "reefs", "iterations": 3}},
                            format="json").json()
    run_id = created["id"]
    run = wait_for(lambda: (r := acme_api.get(f"/api/v1/runs/{run_id}").json())["status"]
                   == "succeeded" and r, what="the worker to finish the run")
    assert run["result"]["findings"] == 3 and run["steps_taken"] == 5

    events = acme_api.get(f"/api/v1/runs/{run_id}/events").json()["results"]
    assert [e["kind"] for e in events] == ["run_created", "run_succeeded"]
    checkpoints = acme_api.get(f"/api/v1/runs/{run_id}/checkpoints").json()["results"]
    assert [c["visit"] for c in checkpoints] == [0, 1, 2, 3, 4, 5]
    state = acme_api.get(f"/api/v1/runs/{run_id}/checkpoints/2/state").json()
    assert state["state"]["iteration"] == 1 and len(state["logs"]["findings"]) == 1
    assert acme_api.get(f"/api/v1/runs/{run_id}/checkpoints/99/state").status_code == 404

    listed = acme_api.get("/api/v1/runs?status=succeeded&agent=research&limit=500").json()
    assert run_id in [r["id"] for r in listed["results"]]
    assert run_id not in [r["id"] for r in acme_api.get("/api/v1/runs?status=failed")
                          .json()["results"]]

    fork = acme_api.post(f"/api/v1/runs/{run_id}/fork", {"visit": 2}, format="json")
    assert fork.status_code == 201 and fork.json()["forked_from"] == run_id
    forked = wait_for(lambda: (r := acme_api.get(f"/api/v1/runs/{fork.json()['id']}").json())
                      ["status"] == "succeeded" and r, what="the fork to finish")
    assert forked["result"] == run["result"]
    assert acme_api.post(f"/api/v1/runs/{run_id}/cancel").json()["error"]["code"] == "run_finished"


def test_cancel_of_a_running_run_takes_effect_at_the_next_step_boundary(acme_api, worker):
    run_id = acme_api.post("/api/v1/runs", {"agent": "slowpoke", "input": {"seconds": 0.3}},
                           format="json").json()["id"]
    wait_for(lambda: acme_api.get(f"/api/v1/runs/{run_id}").json()["steps_taken"] >= 1,
             what="the run to take a step")
    response = acme_api.post(f"/api/v1/runs/{run_id}/cancel")
    assert response.status_code == 202
    run = wait_for(lambda: (r := acme_api.get(f"/api/v1/runs/{run_id}").json())["status"]
                   == "cancelled" and r, what="the cancel to take effect")
    steps_at_cancel = run["steps_taken"]
    kinds = [e["kind"] for e in acme_api.get(f"/api/v1/runs/{run_id}/events").json()["results"]]
    assert kinds[-1] == "run_cancelled"
    assert acme_api.get(f"/api/v1/runs/{run_id}").json()["steps_taken"] == steps_at_cancel


def test_agents_are_listed_with_their_topology(acme_api):
    agents = {a["name"]: a for a in acme_api.get("/api/v1/agents").json()["results"]}
    assert agents["research"]["steps"] == {"investigate": ["investigate", "summarize"],
                                           "plan": ["investigate"], "summarize": []}


def test_openapi_schema_is_served():
    response = api_client(None).get("/api/v1/schema")
    assert response.status_code == 200 and b"/api/v1/runs" in response.content
