"""Tenant-supplied destinations may not point into our own networks (SSRF).

A name is resolved once; every address it resolves to must be public; the connection goes to
the checked address (Host and TLS SNI keep the name); a name that does not resolve is refused;
only the expected ports are allowed; operator hosts are trusted only when they come from
settings. These tests run with CONNECTOR_ALLOW_PRIVATE_DESTINATIONS off unless they say so.

DNS answers come from `zone` (below): the attacker's DNS server is a remote service, so it is
faked, at the one place every lookup of the process passes (socket.getaddrinfo): a second lookup
made anywhere (by http.client or smtplib on their own, not only by our guard) is seen and
answered differently, which is what DNS rebinding does.
"""

import datetime
import socket
import ssl
import tempfile
import threading
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agentplatform.addresses import address_refusal
from integrations.connectors import ConnectorError, connector_get
from integrations.connectors.transport import destination_resolve, request

ZONE = ".ssrf.test"
PUBLIC = "8.8.8.8"  # globally routable: only ever checked, never connected to


class Zone:
    """A hostile zone: each name has a list of answers, one per lookup (the last one repeats);
    an answer is a list of addresses, or an OSError to raise. Counts lookups per name."""

    def __init__(self, real):
        self.real, self.answers, self.lookups = real, {}, {}

    def __call__(self, host, port, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else str(host)
        if not name.endswith(ZONE):
            return self.real(host, port, *args, **kwargs)
        count = self.lookups[name] = self.lookups.get(name, 0) + 1
        answers = self.answers[name]
        answer = answers[min(count, len(answers)) - 1]
        if isinstance(answer, OSError):
            raise answer
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port or 0) if ":" not in a else (a, port or 0, 0, 0)) for a in answer]


@pytest.fixture
def zone(monkeypatch):
    fake = Zone(socket.getaddrinfo)
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return fake


@pytest.fixture
def guarded(settings):
    """Production's rules: no private destinations for tenants, the platform's relay elsewhere."""
    settings.CONNECTOR_ALLOW_PRIVATE_DESTINATIONS = False
    settings.CONNECTOR_TIMEOUT_SECONDS = 1.0
    return settings


def webhook_call(call, url):
    return call({"url": url, "payload": {"order": 42}}, {"signing_secret": "whsec_test"})


# -- the guard's rules --------------------------------------------------------------------------

@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.0.0.5", "169.254.169.254", "192.168.1.1", "100.64.0.1", "0.0.0.0", "::1",
    "::", "fe80::1", "fd00::5", "::ffff:127.0.0.1", "::ffff:169.254.169.254",
    "2002:7f00:1::",  # 6to4 carrying 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 carrying 169.254.169.254
    "224.0.0.1",
    # what Python 3.11's is_global calls global: the answer must not depend on the version
    "fec0::1", "feff::1",  # deprecated site-local, still routed inside some networks
    "2002:a9fe:a9fe::", "2002:c0a8:101::", "2002:a00:5::",  # 6to4 of metadata, 192.168/16, 10/8
    "2001:db8::1", "3fff::1",  # documentation
    "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo whose client is 127.0.0.1
    "::127.0.0.1", "::ffff:0:7f00:1",  # IPv4-compatible and IPv4-translated forms
    "64:ff9b:1::a9fe:a9fe",  # local-use NAT64
    "192.88.99.1", "198.18.0.1", "192.0.0.8", "240.0.0.1", "255.255.255.255",
    "fe80::1%eth0", "not-an-address",
])
def test_non_public_addresses_are_refused(address):
    assert address_refusal(address)


@pytest.mark.parametrize("address", [
    "8.8.8.8", "2001:4860:4860::8888",
    "2002:808:808::1", "64:ff9b::808:808", "::ffff:8.8.8.8",  # carrying a public IPv4 address
])
def test_public_addresses_are_allowed(address):
    assert address_refusal(address) == ""


@pytest.mark.parametrize("address", ["fec0::1", "2002:7f00:1::", "2002:a9fe:a9fe::"])
def test_a_name_resolving_to_an_ipv6_form_of_a_private_address_is_refused(guarded, zone,
                                                                          address):
    zone.answers["sitelocal.ssrf.test"] = [[address]]
    with pytest.raises(ConnectorError, match="non-public address") as refused:
        destination_resolve("sitelocal.ssrf.test", 443, receiver="webhook", ports=[443])
    assert refused.value.sent is False


# -- tenant URLs through the webhook connector: nothing reaches the receiver on loopback ---------

@pytest.mark.parametrize("host", [
    "localhost",  # also the platform's EMAIL_HOST: operator trust is not tenant trust
    "127.0.0.1", "[::1]", "0.0.0.0", "2130706433",  # 127.0.0.1 written as one decimal number
    "0x7f.1", "[::ffff:127.0.0.1]", "[2002:7f00:1::]", "[64:ff9b::7f00:1]",
    "loopback.ssrf.test", "internal.ssrf.test", "metadata.ssrf.test", "mixed.ssrf.test",
])
def test_a_tenant_url_into_our_networks_is_refused_before_connecting(guarded, zone, fake_webhook,
                                                                     call, host):
    guarded.EMAIL_HOST = "localhost"
    guarded.CONNECTOR_HTTP_PORTS = [fake_webhook.port]  # the port is not what refuses it
    zone.answers.update({
        "loopback.ssrf.test": [["127.0.0.1"]], "internal.ssrf.test": [["10.0.0.5"]],
        "metadata.ssrf.test": [["169.254.169.254"]],
        "mixed.ssrf.test": [[PUBLIC, "127.0.0.1"]],  # one bad address is enough
    })
    with pytest.raises(ConnectorError, match="non-public address") as refused:
        connector_get("webhook").execute(webhook_call(call, f"http://{host}:{fake_webhook.port}/"))
    assert refused.value.retryable is False and refused.value.sent is False
    assert fake_webhook.deliveries == []


def test_a_name_that_rebinds_on_the_second_lookup_is_reached_at_the_address_that_was_checked(
        zone, fake_webhook, call):
    # Loopback only (this machine talks to no other address): private destinations are allowed
    # here, so what is tested is the pinning. The second answer points where nothing listens;
    # a client that looked the name up again would fail to connect there.
    zone.answers["rebind.ssrf.test"] = [["127.0.0.1"], ["127.0.0.2"]]
    connector_get("webhook").execute(
        webhook_call(call, f"http://rebind.ssrf.test:{fake_webhook.port}/hook"))
    assert zone.lookups["rebind.ssrf.test"] == 1
    assert len(fake_webhook.deliveries) == 1


def test_a_name_that_fails_to_resolve_is_refused_even_if_it_resolves_later(
        guarded, zone, fake_webhook, call):
    guarded.CONNECTOR_HTTP_PORTS = [fake_webhook.port]
    zone.answers["flaky.ssrf.test"] = [socket.gaierror(socket.EAI_AGAIN, "Temporary failure"),
                                       ["127.0.0.1"]]
    with pytest.raises(ConnectorError, match="does not resolve") as refused:
        connector_get("webhook").execute(
            webhook_call(call, f"http://flaky.ssrf.test:{fake_webhook.port}/hook"))
    assert refused.value.sent is False
    assert zone.lookups["flaky.ssrf.test"] == 1
    assert fake_webhook.deliveries == []


@pytest.mark.parametrize("url", ["http://hooks.ssrf.test:5432/", "https://hooks.ssrf.test:6379/",
                                 "http://hooks.ssrf.test:8080/"])
def test_a_tenant_url_on_another_port_is_refused(guarded, zone, call, url):
    zone.answers["hooks.ssrf.test"] = [[PUBLIC]]
    with pytest.raises(ConnectorError, match=r"port \d+ is not allowed") as refused:
        connector_get("webhook").execute(webhook_call(call, url))
    assert refused.value.retryable is False
    assert zone.lookups.get("hooks.ssrf.test", 0) == 0  # refused before any lookup


def test_ports_80_and_443_are_allowed_by_default(guarded, zone):
    zone.answers["hooks.ssrf.test"] = [[PUBLIC]]
    for port in (80, 443):
        destination = destination_resolve("hooks.ssrf.test", port, receiver="webhook",
                                          ports=guarded.CONNECTOR_HTTP_PORTS)
        assert destination.addresses == ((socket.AF_INET, PUBLIC),)


# -- operator hosts: trusted when they come from settings, never when a tenant names them ---------

def test_the_operators_slack_url_is_trusted_but_the_same_url_from_a_tenant_is_not(
        guarded, fake_slack, call):
    guarded.SLACK_API_URL = f"{fake_slack.url}/api"  # on loopback, at a free port: the operator's choice
    slack = connector_get("slack")
    sent = slack.execute(call({"channel": "C1", "text": "hi"}, {"token": "xoxb-test"}))
    assert sent["channel"] == "C1"
    with pytest.raises(ConnectorError, match="not allowed|non-public"):
        slack.execute(call({"channel": "C1", "text": "again"},
                           {"token": "xoxb-test", "api_url": f"{fake_slack.url}/api"}))
    assert sum(len(items) for items in fake_slack.messages.values()) == 1


def test_the_platforms_relay_is_trusted_but_a_tenant_smtp_host_on_it_is_not(
        guarded, smtp_server, call):
    guarded.EMAIL_HOST, guarded.EMAIL_PORT = smtp_server.host, smtp_server.port
    guarded.CONNECTOR_SMTP_PORTS = [smtp_server.port]  # the address, not the port, refuses it
    email = connector_get("email")
    email.execute(call({"to": "a@example.com", "subject": "s", "body": "b"}))
    for host in ("localhost", smtp_server.host):
        with pytest.raises(ConnectorError, match="non-public address"):
            email.execute(call({"to": "a@example.com", "subject": "s", "body": "b"},
                               {"host": host, "port": smtp_server.port}))
    assert len(smtp_server.messages) == 1


def test_a_tenant_smtp_host_that_rebinds_is_reached_at_the_address_that_was_checked(
        zone, smtp_server, call):
    zone.answers["mail.ssrf.test"] = [["127.0.0.1"], ["127.0.0.2"]]  # as above: loopback only
    connector_get("email").execute(call({"to": "a@example.com", "subject": "s", "body": "b"},
                                        {"host": "mail.ssrf.test", "port": smtp_server.port}))
    assert zone.lookups["mail.ssrf.test"] == 1
    assert len(smtp_server.messages) == 1


def test_a_tenant_smtp_host_that_does_not_resolve_is_refused(guarded, zone, smtp_server, call):
    guarded.CONNECTOR_SMTP_PORTS = [smtp_server.port]
    zone.answers["mail.ssrf.test"] = [socket.gaierror(socket.EAI_NONAME, "Name or service not "
                                                      "known"), ["127.0.0.1"]]
    with pytest.raises(ConnectorError, match="does not resolve"):
        connector_get("email").execute(call({"to": "a@example.com", "subject": "s", "body": "b"},
                                            {"host": "mail.ssrf.test", "port": smtp_server.port}))
    assert smtp_server.messages == []


@pytest.mark.parametrize("port", [2525, 5432, 6379])
def test_a_tenant_smtp_host_on_another_port_is_refused(guarded, zone, call, port):
    zone.answers["mail.ssrf.test"] = [[PUBLIC]]
    with pytest.raises(ConnectorError, match=f"port {port} is not allowed"):
        connector_get("email").execute(call({"to": "a@example.com", "subject": "s", "body": "b"},
                                            {"host": "mail.ssrf.test", "port": port}))
    assert zone.lookups.get("mail.ssrf.test", 0) == 0


# -- what is connected to: the checked address, with the name for Host and SNI -------------------

def test_the_request_goes_to_the_checked_address_with_the_name_as_host(zone, fake_webhook, call):
    # loopback allowed (the suite's setting), so the fake can answer; the second answer would
    # point elsewhere (127.0.0.2, where nothing listens)
    zone.answers["pinned.ssrf.test"] = [["127.0.0.1"], ["127.0.0.2"]]
    result = connector_get("webhook").execute(
        webhook_call(call, f"http://pinned.ssrf.test:{fake_webhook.port}/hook"))
    assert result["status"] == 200
    [delivery] = fake_webhook.deliveries
    assert delivery["headers"]["Host"] == f"pinned.ssrf.test:{fake_webhook.port}"
    assert zone.lookups["pinned.ssrf.test"] == 1


@pytest.fixture
def tls_server():
    """A TLS listener on 127.0.0.1 with a self-signed certificate that records the SNI name
    each client asks for (then the handshake fails at the client: nobody trusts the cert)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tls.ssrf.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("tls.ssrf.test")]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    with tempfile.TemporaryDirectory() as tmp:
        cert_path, key_path = f"{tmp}/cert.pem", f"{tmp}/key.pem"
        with open(cert_path, "wb") as out:
            out.write(cert.public_bytes(serialization.Encoding.PEM))
        with open(key_path, "wb") as out:
            out.write(key.private_bytes(serialization.Encoding.PEM,
                                        serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_path, key_path)
    seen: list[str | None] = []
    context.sni_callback = lambda sock, server_name, ctx: seen.append(server_name)
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                client.settimeout(5)
                context.wrap_socket(client, server_side=True).close()
            except (OSError, ssl.SSLError):
                client.close()

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1], seen
    listener.close()


def test_https_to_the_checked_address_sends_the_name_as_sni_and_verifies_it(zone, tls_server):
    port, seen = tls_server
    zone.answers["tls.ssrf.test"] = [["127.0.0.1"], ["127.0.0.2"]]
    with pytest.raises(ConnectorError, match="CERTIFICATE_VERIFY_FAILED") as failed:
        request("POST", f"https://tls.ssrf.test:{port}/hook", headers={}, body=b"{}",
                receiver="webhook")
    assert failed.value.sent is False
    assert seen == ["tls.ssrf.test"]
    assert zone.lookups["tls.ssrf.test"] == 1


def test_smtps_to_the_checked_address_sends_the_name_as_sni_and_verifies_it(zone, tls_server, call):
    port, seen = tls_server
    zone.answers["tls.ssrf.test"] = [["127.0.0.1"], ["127.0.0.2"]]
    with pytest.raises(ConnectorError, match="cannot open an SMTP session.*CERTIFICATE_VERIFY_FAILED"):
        connector_get("email").execute(call({"to": "a@example.com", "subject": "s", "body": "b"},
                                            {"host": "tls.ssrf.test", "port": port, "use_ssl": True}))
    assert seen == ["tls.ssrf.test"]
    assert zone.lookups["tls.ssrf.test"] == 1


# -- one deadline per call: a receiver that drips its answer cannot hold a worker ---------------

class Drip:
    """A receiver on loopback that answers each connection with `answer`, one byte every `pace`
    seconds (each read is well under the timeout; the whole answer is not)."""

    def __init__(self, answer: bytes, pace: float, *, read_first: bool):
        self.answer, self.pace, self.read_first = answer, pace, read_first
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                if self.read_first:
                    client.recv(65536)
                for byte in self.answer:
                    if self.stop.wait(self.pace):
                        break
                    client.sendall(bytes([byte]))
            except OSError:
                pass  # the client gave up: what is tested
            finally:
                client.close()

    def close(self):
        self.stop.set()
        self.listener.close()


@pytest.fixture
def drip():
    made = []

    def make(answer: bytes, pace: float = 0.25, *, read_first: bool = True) -> Drip:
        made.append(Drip(answer, pace, read_first=read_first))
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


def test_an_http_answer_dripped_a_byte_at_a_time_ends_at_the_calls_deadline(settings, drip, call):
    settings.CONNECTOR_TIMEOUT_SECONDS = 1.0
    # 80 bytes at 0.25 s each: 20 s, every single read well within the 1 s timeout
    slow = drip(b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n" + b"x" * 40)
    began = time.monotonic()
    with pytest.raises(ConnectorError, match="timed out") as raised:
        connector_get("webhook").execute(webhook_call(call, f"http://127.0.0.1:{slow.port}/hook"))
    assert time.monotonic() - began < 4
    assert raised.value.retryable and raised.value.sent


def test_http_headers_dripped_forever_end_at_the_calls_deadline(settings, drip, call):
    settings.CONNECTOR_TIMEOUT_SECONDS = 1.0
    slow = drip(b"HTTP/1.1 200 OK\r\n" + b"X-Slow: y\r\n" * 20, pace=0.1)
    began = time.monotonic()
    with pytest.raises(ConnectorError, match="timed out"):
        connector_get("webhook").execute(webhook_call(call, f"http://127.0.0.1:{slow.port}/hook"))
    assert time.monotonic() - began < 4


def test_an_smtp_server_that_drips_its_greeting_ends_at_the_calls_deadline(settings, zone, drip,
                                                                          call):
    settings.CONNECTOR_TIMEOUT_SECONDS = 1.0
    slow = drip(b"220-" + b"x" * 60 + b"\r\n220 ok\r\n", read_first=False)  # 17 s of greeting
    zone.answers["mail.ssrf.test"] = [["127.0.0.1"]]  # loopback: the suite allows it
    began = time.monotonic()
    with pytest.raises(ConnectorError, match="cannot open an SMTP session") as raised:
        connector_get("email").execute(call({"to": "a@example.com", "subject": "s", "body": "b"},
                                            {"host": "mail.ssrf.test", "port": slow.port}))
    assert time.monotonic() - began < 4
    assert raised.value.sent is False


def test_a_large_answer_from_a_receiver_that_closes_is_read_whole(drip):
    body = bytes(range(256)) * 1024  # 256 KiB: many reads, after http.client closed its end
    answer = b"HTTP/1.0 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
    receiver = socket.create_server(("127.0.0.1", 0))

    def serve():
        client, _ = receiver.accept()
        client.recv(65536)
        client.sendall(answer)
        for start in range(0, len(body), 16384):
            time.sleep(0.005)
            client.sendall(body[start:start + 16384])
        client.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        response = request("GET", f"http://127.0.0.1:{receiver.getsockname()[1]}/big", headers={},
                           receiver="webhook")
    finally:
        receiver.close()
    assert response.status == 200 and response.body == body


def test_a_name_with_many_unanswering_addresses_ends_at_the_calls_deadline(settings, zone, call):
    settings.CONNECTOR_TIMEOUT_SECONDS = 1.0
    # a listener whose accept queue is full: the kernel drops further SYNs, so each connect hangs
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    port = full.getsockname()[1]
    held = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            held.append(filler)
        probe = socket.socket()
        probe.settimeout(0.5)
        with pytest.raises(TimeoutError):  # the premise: a connect here hangs
            probe.connect(("127.0.0.1", port))
        probe.close()
        zone.answers["many.ssrf.test"] = [["127.0.0.1"] * 8]  # 8 s if each got the timeout
        began = time.monotonic()
        with pytest.raises(ConnectorError, match="cannot connect") as raised:
            connector_get("webhook").execute(webhook_call(call, f"http://many.ssrf.test:{port}/"))
        assert time.monotonic() - began < 4
        assert raised.value.sent is False
    finally:
        for sock in (*held, full):
            sock.close()
