"""What schema-based sharding (Citus 12+ places each tenant's schema whole on one node) needs of
the code, checked on the SQL the tenant side really runs (decision 0023): no statement names
two tenants' schemas; no statement mixes a tenant's tables with public ones; and the public
tables a tenant's transactions touch at all are the ones listed below, each small or a queue
of the coordinator's."""

import re
from contextlib import contextmanager

from django.db import connection
from django_tenants.utils import tenant_context

from runs.approvals.models import Approval
from runs.approvals.services import approval_decide, event_submit
from runs.effects.models import OutboxMessage
from runs.engine import store
from tests.support.runs import finished, start

# Public tables a tenant's transactions may touch (decision 0023), and why they may.
SHARDING_PUBLIC_TABLES = {
    "tenants_tenant": "reference: one row per tenant",
    "usage_plan": "reference: a handful of plans",
    "usage_tenantquota": "reference: one row per tenant",
    "webhooks_slackconnection": "reference: a tenant's Slack workspaces, read to announce",
    "dispatch_readyrun": "coordinator queue: written in its own statements, never joined",
    "dispatch_wakeup": "coordinator queue: written in its own statements, never joined",
    "dispatch_tenantdue": "coordinator queue: the due-index, marked in statements of its own",
}
IDENTIFIER = re.compile(r'(?:"([a-z0-9_]+)"|\b([a-z0-9_]+))\.\s*"?([a-z0-9_]+)"?|"([a-z0-9_]+)"'
                        r'|\b([a-z]+_[a-z0-9_]+)\b')


@contextmanager
def statements(monkeypatch):
    """Every statement run meanwhile: Django's, and the engine's prepared ones (its hot path
    goes to psycopg directly)."""
    seen: list[tuple[str, str]] = []

    def record(execute, sql, params, many, context):
        seen.append((connection.schema_name, str(sql)))
        return execute(sql, params, many, context)

    prepared = store.prepared_row

    def record_prepared(sql, params):
        seen.append((connection.schema_name, sql))
        return prepared(sql, params)

    monkeypatch.setattr(store, "prepared_row", record_prepared)
    with connection.execute_wrapper(record):
        yield seen


def tables_of(schema: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                       [schema])
        return {name for (name,) in cursor.fetchall()}


def tables_named(sql: str, tenant_tables: set[str], public_tables: set[str],
                 schemas: set[str]) -> tuple[set[str], set[tuple[str, str]]]:
    """(the tenant schemas a statement names, its tables as (where, name)): a table qualified
    by a schema is there; an unqualified one is the tenant's if the tenant has it (the
    search_path is the tenant's, then public), else public's."""
    named, tables = set(), set()
    for schema, bare_schema, qualified, quoted, bare in IDENTIFIER.findall(sql):
        owner = schema or bare_schema
        if qualified and owner in schemas | {"public"}:
            named |= {owner} - {"public"}
            tables.add(("public" if owner == "public" else "tenant", qualified))
        elif name := quoted or bare:
            if name in tenant_tables:
                tables.add(("tenant", name))
            elif name in public_tables:
                tables.add(("public", name))
    return named, tables


def test_the_tenant_side_sql_keeps_to_one_schema_and_to_reference_like_public_tables(
        acme, globex, monkeypatch):
    with statements(monkeypatch) as seen:
        for tenant in (acme, globex):
            with tenant_context(tenant):
                finished(start("chatter", input={"steps": 3}).id)
                parked = finished(start("waiter", input={"how": "approval"}).id)
                approval_decide(approval_id=Approval.objects.get(run=parked, status="pending").id,
                                approve=True, by="test")
                finished(parked.id)
                waiting = finished(start("waiter", input={"how": "event", "kind": "doc.signed",
                                                          "key": f"k-{tenant.schema_name}"}).id)
                event_submit(kind="doc.signed", key=f"k-{tenant.schema_name}", payload={})
                finished(waiting.id)
                finished(start("graph-chatter", input={"steps": 2}).id)
                herald = finished(start("herald", input={"url": "http://127.0.0.1:9/notify"}).id)
                assert OutboxMessage.objects.filter(run=herald).delete()[0] == 3  # nowhere to go
    tenant_tables, public_tables = tables_of("acme"), tables_of("public")
    touched: set[str] = set()
    tenant_side = [(schema, sql) for schema, sql in seen if schema != "public"]
    assert len(tenant_side) > 100  # the flows above ran on the tenant side
    for schema, sql in tenant_side:
        named, tables = tables_named(sql, tenant_tables, public_tables, {"acme", "globex"})
        assert named <= {schema}, f"a statement in {schema} names {named}: {sql[:300]}"
        public = {name for where, name in tables if where == "public"}
        touched |= public
        assert not (public and any(where == "tenant" for where, _ in tables)), (
            f"a statement mixes public {sorted(public)} with the tenant's tables: {sql[:300]}")
    assert touched <= SHARDING_PUBLIC_TABLES.keys(), (
        f"tenant transactions touch public tables not in decision 0023: "
        f"{sorted(touched - SHARDING_PUBLIC_TABLES.keys())}")
    # the scan sees public tables, the engine's own statements included
    assert {"dispatch_readyrun", "usage_tenantquota", "dispatch_tenantdue"} <= touched
    assert any("INSERT INTO" in sql and "checkpoint" in sql for _, sql in tenant_side)
