"""Sandbox egress: off by default; with a tenant's allow-list, the jail reaches exactly those
hosts through the host-side CONNECT proxy and nothing else (never the database). All traffic
in these tests stays on 127.0.0.1."""

import logging
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection
from django_tenants.utils import tenant_context

from runs.services import run_start
from sandboxes.egress import EgressPolicy, EgressRuleInvalid, egress_rule_parse
from sandboxes.jail import sandbox_execute
from sandboxes.models import SandboxEgressRule
from sandboxes.selectors import egress_rules
from sandboxes.services import SandboxSession, egress_allow, egress_clear
from tests.integrations.test_transport_ssrf import zone  # noqa: F401  (the fake resolver)
from tests.sandboxes.test_jail import run, tight, workspace

# Inside the jail: open a CONNECT tunnel through $HTTPS_PROXY, then speak plain HTTP in it.
TUNNEL_GET = r"""
import os, socket, sys
target = sys.argv[1]
proxy = os.environ.get("HTTPS_PROXY")
if not proxy:
    print("NO PROXY"); sys.exit(3)
host, port = proxy.rsplit("/", 1)[-1].split(":")
try:
    s = socket.create_connection((host, int(port)), timeout=5)
except OSError as exc:
    print("PROXY UNREACHABLE", type(exc).__name__); sys.exit(4)
s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
f = s.makefile("rb")
status = f.readline().decode().strip()
print("PROXY SAID", status)
while f.readline() not in (b"\r\n", b""):
    pass
if " 200 " not in status + " ":
    print(f.read().decode().strip()); sys.exit(5)
s.sendall(b"GET /hello HTTP/1.0\r\nHost: x\r\n\r\n")
print(f.read().decode())
"""

URLLIB_GET = """
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())
except Exception as exc:
    print("FAILED", type(exc).__name__, exc); sys.exit(6)
"""


@pytest.fixture
def server():
    """A plain HTTP server on 127.0.0.1 that remembers every request it saw."""
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(self.path)
            body = b"hello from the allowed host"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    httpd.seen = seen
    httpd.port = httpd.server_address[1]
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def policy(*rules: str, tenant: str = "acme") -> EgressPolicy:
    return EgressPolicy(tenant=tenant, run=str(uuid.uuid4()),
                        rules=tuple(egress_rule_parse(rule) for rule in rules))


def jailed(command, egress=None):
    return sandbox_execute(workspace=workspace(), command=command, limits=tight(), egress=egress)


def test_without_an_allow_list_there_is_no_proxy_and_no_network(server):
    target = f"127.0.0.1:{server.port}"
    result = run(["python3", "-c", TUNNEL_GET, target])
    assert result.exit_code == 3 and "NO PROXY" in result.stdout
    # Even pointed at where the proxy would be, nothing listens and nothing routes out.
    result = run(["/usr/bin/env", "HTTPS_PROXY=http://127.0.0.1:3128", "python3", "-c",
                  TUNNEL_GET, target])
    assert result.exit_code == 4, result.stdout + result.stderr
    result = run(["python3", "-c", URLLIB_GET, f"http://127.0.0.1:{server.port}/"])
    assert result.exit_code == 6 and "hello" not in result.stdout
    assert jailed("env", egress=policy()).stdout.count("PROXY") == 0  # empty list: no proxy
    assert server.seen == []


def test_allow_listed_host_is_reached_through_the_proxy(server, caplog):
    caplog.set_level(logging.INFO, logger="sandboxes.egress")
    egress = policy(f"127.0.0.1:{server.port}")
    result = jailed(["python3", "-c", TUNNEL_GET, f"127.0.0.1:{server.port}"], egress=egress)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "200 Connection established" in result.stdout
    assert "hello from the allowed host" in result.stdout
    assert server.seen == ["/hello"]
    [record] = [r for r in caplog.records if r.name == "sandboxes.egress"]
    assert record.egress_allowed and record.tenant == "acme" and record.run_id == egress.run
    assert "hello" not in record.getMessage()  # decisions are logged, payloads never


def test_curl_in_the_jail_uses_the_proxy_environment(server):
    egress = policy(f"127.0.0.1:{server.port}")
    result = jailed(f"curl -sS --proxytunnel http://127.0.0.1:{server.port}/via-curl",
                    egress=egress)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "hello from the allowed host"
    assert server.seen == ["/via-curl"]


def test_host_not_on_the_list_gets_403_and_the_server_sees_nothing(server, caplog):
    caplog.set_level(logging.INFO, logger="sandboxes.egress")
    egress = policy("api.example.com", f"127.0.0.1:{server.port + 1}")
    result = jailed(["python3", "-c", TUNNEL_GET, f"127.0.0.1:{server.port}"], egress=egress)
    assert result.exit_code == 5 and "403 Forbidden" in result.stdout
    assert "not on the tenant's egress allow-list" in result.stdout
    assert server.seen == []
    [record] = [r for r in caplog.records if r.name == "sandboxes.egress"]
    assert not record.egress_allowed and record.egress_port == server.port


def test_database_port_is_refused_even_when_another_loopback_port_is_allowed(server):
    egress = policy(f"127.0.0.1:{server.port}")
    for target in ("127.0.0.1:5432", "localhost:5432", f"localhost:{server.port}",
                   "[::1]:5432", "127.0.0.2:5432"):
        result = jailed(["python3", "-c", TUNNEL_GET, target], egress=egress)
        assert result.exit_code == 5 and "403 Forbidden" in result.stdout, (target, result)
    # A name allowed by the list that resolves to loopback is refused too.
    result = jailed(["python3", "-c", TUNNEL_GET, "localhost:443"], egress=policy("localhost"))
    assert "403 Forbidden" in result.stdout and "non-public address" in result.stdout


def test_only_connect_is_proxied(server):
    egress = policy(f"127.0.0.1:{server.port}")
    result = jailed(["python3", "-c", URLLIB_GET, f"http://127.0.0.1:{server.port}/plain"],
                    egress=egress)  # urllib sends plain HTTP as an absolute-URI GET
    assert result.exit_code == 6 and "403" in result.stdout
    assert server.seen == []


def test_allow_list_entries_are_validated_and_matched():
    assert str(egress_rule_parse("API.Example.com.")) == "api.example.com"
    rule = egress_rule_parse("*.example.com")
    assert rule.matches("a.example.com", 443) and rule.matches("a.b.example.com", 80)
    assert not rule.matches("example.com", 443) and not rule.matches("a.example.com", 8443)
    assert not rule.matches("evilexample.com", 443)
    assert egress_rule_parse("example.com:8443").matches("example.com", 8443)
    assert not egress_rule_parse("example.com:8443").matches("example.com", 443)
    assert not egress_rule_parse("*.0.0.1").matches("127.0.0.1", 443)  # IPs match only IPs
    assert egress_rule_parse("[::1]:80").matches("::1", 80)
    for bad in ("", "*.com", "exa mple.com", "example.com:0", "example.com:http", "a/b"):
        with pytest.raises(EgressRuleInvalid):
            egress_rule_parse(bad)


@pytest.mark.parametrize("address", [
    "2002:7f00:1::", "2002:a9fe:a9fe::", "2002:a00:5::",  # 6to4 of loopback, metadata, 10/8
    "fec0::1",  # site-local: Python 3.11 calls it global
    "64:ff9b::7f00:1", "2001:0:4136:e378:8000:63bf:80ff:fffe",  # NAT64, Teredo of 127.0.0.1
    "::ffff:10.0.0.5", "10.0.0.5", "192.88.99.1",
])
def test_a_name_resolving_to_any_form_of_a_private_address_is_denied(zone, address):  # noqa: F811
    zone.answers["x.pkg.ssrf.test"] = [[address]]
    policy = EgressPolicy(tenant="acme", run="r", rules=(egress_rule_parse("*.pkg.ssrf.test"),))
    addresses, why = policy.decide("x.pkg.ssrf.test", 443)
    assert addresses == [] and "non-public address" in why


def test_a_name_resolving_to_public_addresses_is_allowed(zone):  # noqa: F811
    zone.answers["x.pkg.ssrf.test"] = [["8.8.8.8", "2002:808:808::1"]]  # checked, not connected to
    policy = EgressPolicy(tenant="acme", run="r", rules=(egress_rule_parse("*.pkg.ssrf.test"),))
    addresses, why = policy.decide("x.pkg.ssrf.test", 443)
    assert why == "" and [sockaddr[0] for _, sockaddr in addresses] == ["8.8.8.8", "2002:808:808::1"]


@pytest.fixture
def globex_run(globex):
    with tenant_context(globex):
        return run_start(agent="sandboxed", input={"steps": [["true"]]}, enqueue=False).run


def test_tenant_allow_list_applies_to_its_own_sandbox_calls_only(globex_run, in_acme, globex,
                                                                  server):
    target = f"127.0.0.1:{server.port}"
    egress_clear()
    assert egress_rules() == []  # off by default
    egress_allow(hosts=[target, "*.example.com"])
    egress_allow(hosts=[target])  # allowing again changes nothing
    assert [str(rule) for rule in egress_rules()] == [target, "*.example.com"]
    assert SandboxEgressRule.objects.count() == 2
    acme_run = run_start(agent="sandboxed", input={"steps": [["true"]]}, enqueue=False).run
    result = SandboxSession(run_id=acme_run.id, visit=0).run(["python3", "-c", TUNNEL_GET, target])
    assert "hello from the allowed host" in result.stdout, result.stdout + result.stderr
    with tenant_context(globex):
        assert egress_rules() == []
        result = SandboxSession(run_id=globex_run.id, visit=0).run(
            ["python3", "-c", TUNNEL_GET, target])
        assert result.exit_code == 3 and "NO PROXY" in result.stdout
    assert connection.schema_name == "acme"
    egress_clear()
    result = SandboxSession(run_id=acme_run.id, visit=1).run(["python3", "-c", TUNNEL_GET, target])
    assert result.exit_code == 3
    assert server.seen == ["/hello"]


HOLD_TUNNELS = r"""
import os, socket, sys
target, count = sys.argv[1], int(sys.argv[2])
host, port = os.environ["HTTPS_PROXY"].rsplit("/", 1)[-1].split(":")

def tunnel():
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    f = s.makefile("rb")
    status = f.readline().decode().split(" ", 2)[1]
    while f.readline() not in (b"\r\n", b""):
        pass
    return s, status

held = [tunnel() for _ in range(count)]  # all kept open at once
print("held", *[status for _, status in held])
for s, status in held:
    if status == "200":
        s.close()
        break
import time
time.sleep(0.5)  # the proxy notices the closed tunnel
print("after", tunnel()[1])
"""


def test_a_jail_holds_at_most_the_configured_number_of_egress_connections(server, settings,
                                                                          caplog):
    caplog.set_level(logging.INFO, logger="sandboxes.egress")
    settings.SANDBOX_EGRESS_MAX_CONNECTIONS = 3
    egress = policy(f"127.0.0.1:{server.port}")
    result = jailed(["python3", "-c", HOLD_TUNNELS, f"127.0.0.1:{server.port}", "5"],
                    egress=egress)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.stdout.split("\n")[:2] == ["held 200 200 200 503 503", "after 200"]
    refused = [r for r in caplog.records if "concurrent" in r.getMessage()]
    assert len(refused) == 2 and not refused[0].egress_allowed
