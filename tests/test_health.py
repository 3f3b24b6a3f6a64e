"""/healthz and /readyz: no authentication, ok/failing per dependency and nothing more."""

import json
import socket

import pytest
from django.test import Client


def port_nothing_listens_on() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed on exit: connecting is refused


def test_healthz_answers_without_authentication():
    response = Client().get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_readyz_is_ok_when_postgres_redis_and_s3_answer(s3):
    response = Client().get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json() == {"status": "ok", "postgres": "ok", "redis": "ok", "s3": "ok"}
    assert "no-cache" in response["Cache-Control"]


def test_readyz_is_503_naming_redis_when_nothing_listens_there(s3, settings):
    port = port_nothing_listens_on()
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{port}/0"
    settings.HEALTH_CHECK_TIMEOUT_SECONDS = 1.0
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "failing", "postgres": "ok", "redis": "failing",
                               "s3": "ok"}
    body = response.content.decode()
    for detail in ("127.0.0.1", str(port), "localhost", "Error", "refused"):
        assert detail not in body, detail


# Only the readiness check reads DATABASES at request time; Django's own connections keep theirs.
@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
@pytest.mark.parametrize("dependency", ["postgres", "s3"])
def test_readyz_names_each_unreachable_dependency_alone(s3, settings, dependency):
    port = port_nothing_listens_on()
    if dependency == "postgres":
        settings.DATABASES = {"default": {**settings.DATABASES["default"], "PORT": port}}
    else:
        settings.S3_ENDPOINT_URL = f"http://127.0.0.1:{port}"
    settings.HEALTH_CHECK_TIMEOUT_SECONDS = 1.0
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert {name for name, value in json.loads(response.content).items()
            if value == "failing"} == {"status", dependency}
    assert str(port) not in response.content.decode()
