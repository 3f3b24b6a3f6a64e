"""Who may scrape, in process: an allowed network lets its own addresses in, not the outsiders a
reverse proxy in it relays (their address is in X-Forwarded-For or X-Real-IP, and a client
cannot remove the proxy's entry); the token still works from anywhere."""

import pytest
from django.test import Client, override_settings

from agentplatform.prometheus import metrics_app

ALLOWED = {"METRICS_PROMETHEUS": True, "METRICS_TOKEN": "t0ken-for-tests",
           "METRICS_ALLOWED_NETWORKS": ["127.0.0.0/8"]}


@override_settings(**ALLOWED)
@pytest.mark.parametrize("relayed", [{"HTTP_X_FORWARDED_FOR": "203.0.113.9"},
                                     {"HTTP_X_FORWARDED_FOR": "127.0.0.1, 203.0.113.9"},
                                     {"HTTP_X_REAL_IP": "203.0.113.9"},
                                     {"HTTP_FORWARDED": "for=203.0.113.9"}])
def test_an_outsider_relayed_by_an_allowed_proxy_needs_the_token(relayed):
    client = Client(REMOTE_ADDR="127.0.0.1")
    assert client.get("/metrics").status_code == 200  # the network's own scraper
    assert client.get("/metrics", **relayed).status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer t0ken-for-tests",
                      **relayed).status_code == 200
    said = []
    body = metrics_app({"REMOTE_ADDR": "127.0.0.1", **relayed},
                       lambda status, headers: said.append(status))
    assert said == ["401 Unauthorized"], body


@override_settings(**ALLOWED)
def test_a_spoofed_forwarded_for_does_not_let_an_outsider_in():
    client = Client(REMOTE_ADDR="198.51.100.7")
    assert client.get("/metrics", HTTP_X_FORWARDED_FOR="127.0.0.1").status_code == 401

