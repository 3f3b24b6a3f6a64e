"""The REST API as a tenant's program uses it: a client with a key, and waiting on what the
real workers do to a run."""

from rest_framework.test import APIClient

from .waiting import wait_for


def api_client(key: str | None) -> APIClient:
    client = APIClient()
    if key:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def start(api: APIClient, **input) -> str:
    """Start the test agent `waiter` (tests.support.agents) with this input; its id."""
    response = api.post("/api/v1/runs", {"agent": "waiter", "input": input}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def status_of(api: APIClient, run_id: str, wanted: str, timeout: float = 30) -> dict:
    """Wait until the run has status `wanted`; the run as the API shows it then."""
    return wait_for(lambda: (r := api.get(f"/api/v1/runs/{run_id}").json())["status"] == wanted
                    and r, timeout=timeout, what=f"run {run_id} to be {wanted}")


def pending_approval(api: APIClient, run_id: str) -> dict:
    return wait_for(lambda: api.get(f"/api/v1/approvals?status=pending&run={run_id}")
                    .json()["results"], what="the approval")[0]
