"""The mcp connector against a local MCP server built with the `mcp` package (streamable HTTP,
a subprocess): one tools/call per effect, recorded by the ledger; a call whose outcome a crash
hid is put to a person, never made twice; the tenant's URL passes the SSRF guard; one tenant
never reaches another's server."""

import json

import anyio
import httpcore2
import pytest
from django_tenants.utils import tenant_context

from agentplatform.storable import json_shape, json_storable
from integrations.connectors import ConnectorError, Lookup, connector_get
from integrations.connectors import mcp as mcp_connector
from integrations.connectors import transport as connector_transport
from integrations.services import CredentialError, credential_set
from runs.approvals.models import Approval
from runs.effects.models import Effect
from runs.models import Run
from runs.services import run_start
from tests.support.fakes.mcp_process import McpServerProcess
from tests.support.fakes.smtp import free_port
from tests.support.runs import finished, start
from tests.support.waiting import wait_for


@pytest.fixture
def mcp():
    return connector_get("mcp")


def search(query: str = "ledger") -> dict:
    return {"tool": "search", "arguments": {"query": query}}


# -- the connector ---------------------------------------------------------------------------

def test_a_tool_call_returns_content_structured_and_carries_key_headers_and_token(
        mcp, mcp_server, call):
    credentials = {"url": mcp_server.url, "token": "docs-token", "headers": {"X-Docs-Tenant": "acme"}}
    result = mcp.execute(call(search(), credentials, key="run-1:1:search"))
    assert result["is_error"] is False
    assert result["structured"] == {"query": "ledger",
                                    "hits": [{"id": "ledger", "text": "Effects happen once."}]}
    assert result["content"][0]["type"] == "text"
    state = mcp_server.state()
    assert state["calls"] == {"search": [{"query": "ledger", "limit": 3}]}
    [seen] = state["seen"]
    assert seen["authorization"] == "Bearer docs-token" and seen["header"] == "acme"
    # MCP has no idempotency keys: ours rides in _meta for servers that read it, nothing more
    assert seen["meta"]["io.agentplatform/idempotency-key"] == "run-1:1:search"
    assert not mcp.honours_idempotency_key and not mcp.safe_to_repeat
    assert mcp.lookup(call(search(), credentials)) is Lookup.UNKNOWN


def test_a_tool_that_fails_answers_is_error_and_that_is_its_result(mcp, mcp_server, call):
    result = mcp.execute(call({"tool": "fail", "arguments": {"reason": "no index"}},
                              {"url": mcp_server.url}))
    assert result["is_error"] is True and result["content"][0]["type"] == "text"
    unknown = mcp.execute(call({"tool": "nope", "arguments": {}}, {"url": mcp_server.url}))
    assert unknown["is_error"] is True and "nope" in unknown["content"][0]["text"]


def test_no_session_means_the_tool_was_not_called(mcp, mcp_server, call):
    with pytest.raises(ConnectorError, match="no session.*not called") as refused:
        mcp.execute(call(search(), {"url": f"http://127.0.0.1:{free_port()}/mcp"}))
    assert refused.value.retryable and not refused.value.sent
    with pytest.raises(ConnectorError, match="error -32601") as wrong_path:  # an HTTP 404
        mcp.execute(call(search(), {"url": mcp_server.url.replace("/mcp", "/elsewhere")}))
    assert not wrong_path.value.sent and not wrong_path.value.retryable
    guarded = McpServerProcess(free_port(), token="right").start()
    try:
        with pytest.raises(ConnectorError) as unauthorized:
            mcp.execute(call(search(), {"url": guarded.url, "token": "wrong"}))
        assert not unauthorized.value.sent and unauthorized.value.retryable  # a 401: -32603
        assert guarded.state()["count"] == 0
        assert not mcp.execute(call(search(), {"url": guarded.url, "token": "right"}))["is_error"]
    finally:
        guarded.stop()
    assert mcp_server.state()["count"] == 0


def test_a_call_that_outlives_the_deadline_may_have_run(mcp, mcp_server, call, settings):
    settings.MCP_TIMEOUT_SECONDS = 1.0
    mcp_server.configure(delay=3)
    with pytest.raises(ConnectorError, match="broke off.*no answer within 1s.*may have run") as late:
        mcp.execute(call(search(), {"url": mcp_server.url}))
    assert late.value.sent and late.value.retryable
    assert mcp_server.state()["count"] == 1


def test_a_private_destination_is_refused_unless_allowed(mcp, mcp_server, call, settings):
    settings.CONNECTOR_ALLOW_PRIVATE_DESTINATIONS = False
    with pytest.raises(ConnectorError, match=f"port {mcp_server.port} is not allowed"):
        mcp.execute(call(search(), {"url": mcp_server.url}))
    settings.CONNECTOR_HTTP_PORTS = [80, 443, mcp_server.port]  # the port alone is no way in
    for url in (mcp_server.url, mcp_server.url.replace("127.0.0.1", "localhost"),
                "http://169.254.169.254/mcp", "http://[::1]/mcp", "http://2130706433/mcp"):
        with pytest.raises(ConnectorError, match="non-public address") as refused:
            mcp.execute(call(search(), {"url": url}))
        assert not refused.value.sent and not refused.value.retryable
    with pytest.raises(ConnectorError, match="port 5432 is not allowed"):
        mcp.execute(call(search(), {"url": "https://db.example:5432/mcp"}))
    assert mcp_server.state()["count"] == 0


def test_the_connection_goes_to_the_checked_address_never_a_second_lookup(
        mcp, mcp_server, call, monkeypatch):
    """The name is resolved once (here: to the local server) and every connection of the
    session goes to that address, Host kept; the name itself never resolves."""
    lookups = []

    def resolve(host, port):
        lookups.append(host)
        return [(2, "127.0.0.1")] if host == "docs.acme.example" else []

    monkeypatch.setattr(connector_transport, "resolve", resolve)
    result = mcp.execute(call(search(), {"url": f"http://docs.acme.example:{mcp_server.port}/mcp"}))
    assert not result["is_error"] and lookups == ["docs.acme.example"]


def test_credentials_are_checked_when_stored(in_acme):
    for secrets, problem in [({"token": "t"}, "'url' must be an http"),
                             ({"url": "ftp://docs.example/mcp"}, "'url' must be an http"),
                             ({"url": ["https://docs.example"]}, "'url' must be a string"),
                             ({"url": "https://docs.example/a b"}, "percent-encode"),
                             ({"url": "https://docs.example", "headers": {"X": 1}}, "headers.*strings"),
                             ({"url": "https://docs.example", "headers": ["X: 1"]}, "headers.*strings"),
                             ({"url": "https://docs.example", "headers": {"X": "a\r\nB: c"}}, "line breaks"),
                             ({"url": "https://docs.example", "headers": {"Mcp-Session-Id": "1"}},
                              "may not set Mcp-Session-Id"),
                             ({"url": "https://docs.example", "token": 7}, "'token' must be a string")]:
        with pytest.raises(CredentialError, match=problem):
            credential_set(connector="mcp", label="docs", secrets=secrets)
    credential_set(connector="mcp", label="docs",
                   secrets={"url": "https://docs.example/mcp", "headers": {"X-Team": "a"}, "token": "t"})


# -- through the ledger ------------------------------------------------------------------------

def test_a_call_through_the_ledger_happens_once_and_its_result_is_recorded(in_acme, mcp_server):
    credential_set(connector="mcp", label="docs", secrets={"url": mcp_server.url})
    run = finished(start("mcp_caller", input={"query": "durable"}).id)
    assert run.status == Run.Status.SUCCEEDED, run.error
    effect = Effect.objects.get(run=run, name="search")
    assert effect.connector == "mcp" and effect.status == "done" and effect.attempts == 1
    assert effect.result["structured"]["hits"][0]["id"] == "durable" and run.result == effect.result
    assert mcp_server.state()["calls"] == {"search": [{"query": "durable", "limit": 3}]}


def test_a_tenant_cannot_use_another_tenants_mcp_credential(acme, globex, mcp_server):
    with tenant_context(acme):
        credential_set(connector="mcp", label="docs", secrets={"url": mcp_server.url})
    with tenant_context(globex):
        run = finished(start("mcp_caller", input={"query": "ledger"}).id)
        assert run.status == Run.Status.FAILED and "no 'mcp' credential labelled 'docs'" in run.error
    assert mcp_server.state()["count"] == 0


# -- across worker kills -----------------------------------------------------------------------

def holder_worker(run_id, workers):
    owner = wait_for(lambda: Run.objects.filter(id=run_id).exclude(lease_owner="")
                     .values_list("lease_owner", flat=True).first(), what="a lease holder")
    pid = int(owner.rsplit(":", 1)[1])
    return next(w for w in workers if pid in w.pids())


def test_killed_after_the_call_was_recorded_the_resumed_run_does_not_call_again(
        in_acme, mcp_server, worker, start_worker, tmp_path):
    credential_set(connector="mcp", label="docs", secrets={"url": mcp_server.url})
    workers = [worker, start_worker("mcp-b")]
    marker = tmp_path / "pause"
    marker.touch()
    run = run_start(agent="mcp_caller", input={"query": "tenants", "pause_while": str(marker)}).run
    wait_for(lambda: Effect.objects.filter(run=run, status="done").exists(), timeout=30,
             what="the MCP call to be recorded")
    holder_worker(run.id, workers).kill()  # after the call was recorded, before the step ended
    marker.unlink()
    done = wait_for(lambda: (r := Run.objects.get(id=run.id)).status == "succeeded" and r,
                    timeout=60, what="the run to resume and finish")
    assert done.lease_epoch >= 2
    assert mcp_server.state()["calls"] == {"search": [{"query": "tenants", "limit": 3}]}
    assert done.result["structured"]["hits"][0]["id"] == "tenants"


def test_killed_while_the_call_was_in_flight_the_outcome_is_put_to_a_person(
        in_acme, acme_api, mcp_server, worker, start_worker):
    credential_set(connector="mcp", label="docs", secrets={"url": mcp_server.url})
    workers = [worker, start_worker("mcp-b")]
    mcp_server.configure(delay=20)  # the server has the call; its answer is 20 s away
    run = run_start(agent="mcp_caller", input={"query": "ledger"}).run
    wait_for(lambda: mcp_server.state()["count"] == 1, timeout=30, what="the call to arrive")
    holder_worker(run.id, workers).kill()
    approval = wait_for(lambda: Approval.objects.filter(run=run, status="pending").first(),
                        timeout=60, what="'outcome unknown' in the inbox")
    assert approval.kind == "effect_outcome" and approval.request["connector"] == "mcp"
    assert Run.objects.get(id=run.id).status == "waiting"
    assert Effect.objects.get(run=run).status == "unknown"
    acme_api.post(f"/api/v1/approvals/{approval.id}/decide", {"decision": "approve"}, format="json")
    wait_for(lambda: Run.objects.get(id=run.id).status == "succeeded", timeout=60,
             what="the run to continue on the person's word")
    assert mcp_server.state()["count"] == 1  # at most one call, ever


def test_the_pinned_network_backend_reaches_no_other_host():
    """Whatever the client asks for (a redirect, a second origin), only the checked name and
    port are connected to."""
    destination = connector_transport.Destination(host="docs.acme.example", port=443,
                                                  addresses=((2, "127.0.0.1"),))
    backend = mcp_connector._PinnedBackend(destination)
    for host, port in [("metadata.google.internal", 80), ("127.0.0.1", 443), ("docs.acme.example", 80)]:
        with pytest.raises(httpcore2.ConnectError, match="only the checked destination"):
            anyio.run(backend.connect_tcp, host, port)


def test_an_answer_jsonb_cannot_store_is_kept_storable(mcp, mcp_server, call):
    """The tool ran: its answer must be recordable (jsonb refuses U+0000 and lone surrogates),
    or the ledger's write fails after the call and the run cannot tell whether it acted."""
    answer = mcp.execute(call({"tool": "echo", "arguments": {"text": "a\x00b"}}, {"url": mcp_server.url}))
    result = json_storable(answer)  # what the ledger records
    assert json_shape(result)[1] is None
    assert "a\ufffdb" in json.dumps(result, ensure_ascii=False)
