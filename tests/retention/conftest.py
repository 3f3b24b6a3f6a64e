"""Retention fixtures: finished runs aged past their TTL, and a pass run in acme's schema."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from django_tenants.utils import tenant_context

from runs import engine
from runs.models import Run
from runs.retention import services
from runs.services import run_start

AGED = timedelta(days=60)  # past the default 30-day TTL


def run_finished(*, agent: str = "chatter", steps: int = 5, age: timedelta = AGED, **start) -> Run:
    """A run driven to its end in this process, its end moved `age` into the past."""
    run = run_start(agent=agent, input={"steps": steps}, enqueue=False, **start).run
    while engine.advance(run_id=run.id, slice_seconds=60) != engine.Outcome.ENDED:
        pass
    Run.objects.filter(id=run.id).update(finished_at=timezone.now() - age)
    return Run.objects.get(id=run.id)


@pytest.fixture
def archive_pass(s3, in_acme):
    """acme's archive pass, in acme's schema (API calls in a test leave the connection public)."""
    def run_pass(**kwargs):
        with tenant_context(in_acme):
            report = services.archive_pass(tenant=in_acme, **kwargs)
        connection.set_tenant(in_acme)
        return report

    return run_pass
