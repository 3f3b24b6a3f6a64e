"""Tenant-supplied destinations may not point into our own networks (SSRF)."""

import pytest

from integrations.connectors import ConnectorError
from integrations.connectors.transport import destination_check, request


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "10.0.0.5", "169.254.169.254",
                                  "192.168.1.1", "::1"])
def test_private_destinations_are_refused(settings, host):
    settings.CONNECTOR_ALLOW_PRIVATE_DESTINATIONS = False
    settings.EMAIL_HOST = "smtp.platform.test"  # the one operator host that is trusted
    with pytest.raises(ConnectorError, match="non-public address") as refused:
        destination_check(host, receiver="webhook")
    assert refused.value.retryable is False


def test_a_tenant_url_into_the_database_host_is_refused_before_connecting(settings):
    settings.CONNECTOR_ALLOW_PRIVATE_DESTINATIONS = False
    settings.EMAIL_HOST = "smtp.platform.test"
    with pytest.raises(ConnectorError, match="non-public") as refused:
        request("POST", "http://127.0.0.1:5432/", headers={}, body=b"x", receiver="webhook")
    assert refused.value.sent is False or refused.value.retryable is False


def test_operator_configured_hosts_are_trusted(settings):
    settings.CONNECTOR_ALLOW_PRIVATE_DESTINATIONS = False
    settings.EMAIL_HOST = "127.0.0.1"
    destination_check("127.0.0.1", receiver="email")  # the platform's own relay
