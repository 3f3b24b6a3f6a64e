"""Dashboard tests: people with roles in acme and globex, signed in through the real login form
(Django's test client against the real database)."""

import uuid

import pytest
from django.test import Client

from tenants.people import member_add

# Shares no letters with hex or the roles, so UserAttributeSimilarityValidator never
# finds it close to a random address like operator-1acfe9bc@browser.test (about 1 in 120 did).
PASSWORD = "Zq!Jy-Kx_Vm#Vz-Hq"


def person(tenant, role: str, *, email: str | None = None):
    """A new account with `role` in `tenant` (fresh email each time: tests share the database)."""
    email = email or f"{role}-{uuid.uuid4().hex[:8]}@{tenant.schema_name}.test"
    return member_add(tenant=tenant, email=email, role=role, by="test", password=PASSWORD).user


def signed_in(user) -> Client:
    client = Client()
    response = client.post("/login", {"username": user.username, "password": PASSWORD})
    assert response.status_code == 302, response.content[:500]
    return client


@pytest.fixture
def as_role(acme):
    """`as_role("viewer")`: a client signed in as a new acme member with that role."""
    return lambda role, tenant=None: signed_in(person(tenant or acme, role))
