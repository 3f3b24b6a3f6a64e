"""Attacks on the people-and-settings half of the dashboard, each kept as a regression test:
malformed input that used to answer 500, secrets a browser or proxy could keep, and guessing
that throttling did not count. Each test names the attack."""


from django.test import Client
from django_tenants.utils import tenant_context

from integrations.selectors import credential_find

from .conftest import person, signed_in


def owner_of(tenant) -> Client:
    client = signed_in(person(tenant, "owner"))
    client.raise_request_exception = False  # a 500 is an answer to assert on, not a crash
    return client


def test_a_credential_name_with_nul_is_not_found_not_a_500(acme):
    """/settings/credentials/<connector>/<label>/delete with %00 in the label: PostgreSQL cannot
    compare text with U+0000, so the lookup raised DataError (500)."""
    client = owner_of(acme)
    assert client.get("/t/acme/settings/credentials/slack/a%00b/delete").status_code == 404
    assert client.post("/t/acme/settings/credentials/slack/a%00b/delete").status_code == 404
    with tenant_context(acme):
        assert credential_find(connector="sl\x00ack", label="default") is None
