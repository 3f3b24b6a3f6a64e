"""The LangGraph benchmark runs end to end at tiny sizes: both savers, the conformance suite, and
its closing line in the issue's format."""

import io
import re

import psycopg
from django.conf import settings
from django.db import connection

from bench.database import server_dsn
from bench.langgraph import QUICK_LENGTHS, langgraph_bench
from tenants.services import tenant_create, tenant_delete

CLOSING_LINE = re.compile(
    r"langgraph: conformance=(\d+)/(\d+) steps_per_s_vs_postgressaver=(\d+\.\d\d) "
    r"bytes_per_step_growth=(\d+\.\d\d) postgressaver_growth=(\d+\.\d\d)")


def test_langgraph_bench_runs_both_savers_and_the_conformance_suite_and_prints_its_closing_line(s3):
    dsn = server_dsn(settings.DATABASES["default"]["NAME"])
    tenant = tenant_create(schema_name="bench_langgraph_smoke").tenant
    connection.set_schema_to_public()
    out = io.StringIO()
    try:
        summary = langgraph_bench(schema="bench_langgraph_smoke", postgres_dsn=dsn,
                                  postgres_schema="bench_postgressaver_smoke",
                                  lengths=QUICK_LENGTHS, repeat=1, warmup=3, out=out)
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("DROP SCHEMA IF EXISTS bench_postgressaver_smoke CASCADE")
        tenant_delete(tenant=tenant)  # deletes its S3 objects too: hence the s3 fixture
    lines = out.getvalue().splitlines()
    closing = CLOSING_LINE.fullmatch(lines[-1])
    assert closing, lines[-1]
    passed, total, speed, growth, theirs = closing.groups()
    assert 0 <= int(passed) <= int(total) and int(total) > 0
    assert (int(passed), int(total)) == summary["conformance"]
    assert float(speed) > 0 and float(growth) > 0 and float(theirs) > 0
    for saver in ("PostgresSaver", "PlatformSaver"):
        for steps in QUICK_LENGTHS:
            assert re.search(rf"^{saver}\s+{steps}\s+\d+\s+\d+\.\d+\s+\d+\s+\d+%$", out.getvalue(),
                             re.MULTILINE), (saver, steps)
    assert "durability='async'" in lines[0]
