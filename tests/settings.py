"""Test settings: a dedicated database, Redis db and queue, and secrets made for this session.

Worker processes started by the tests inherit the same environment, so they agree on all of it.
"""

import base64
import os
import secrets

# TEST_SLOT (0-7) lets several checkouts run their suites at once on one machine. The full
# suite's second shard (pytest-xdist worker gw1, see deploy/dev test) takes slot 8 + TEST_SLOT;
# the worker processes it starts inherit the slot it resolved, not the shard's name.
SLOT = int(os.environ.get("TEST_SLOT", "0"))
_SHARD = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
if os.environ.get("TEST_SLOT_SHARD", "gw0") != _SHARD:  # a shard's own processes: resolved
    SLOT = 8 + SLOT + int(_SHARD.removeprefix("gw")) - 1
    if SLOT > 14:  # redis db 15 - SLOT; db 0 is the developer's own
        raise RuntimeError(f"test slot {SLOT} is out of range: use TEST_SLOT 0-5 with two shards")
os.environ["TEST_SLOT"], os.environ["TEST_SLOT_SHARD"] = str(SLOT), _SHARD
# Assigned, not defaulted: a developer's DATABASE_URL must never be the one the tests drop.
os.environ["DATABASE_URL"] = os.environ["DATABASE_DIRECT_URL"] = os.environ.get(
    "TEST_DATABASE_URL", f"postgres://postgres@127.0.0.1:5432/agentplatform{SLOT or ''}_test"
)
# TEST_POOLER_URL (`deploy/dev test` with POOLER=pgbouncer: postgres://user@host:port of a
# transaction pool): the test processes, workers included, reach the same database through it;
# making and dropping it and the session locks go to PostgreSQL itself (DATABASE_DIRECT_URL).
if os.environ.get("TEST_POOLER_URL"):
    os.environ["DATABASE_URL"] = (os.environ["TEST_POOLER_URL"].rstrip("/") + "/"
                                  + os.environ["DATABASE_DIRECT_URL"].rsplit("/", 1)[1])
    os.environ.setdefault("DATABASE_POOL_MODE", "transaction")
    os.environ.setdefault("DATABASE_PREPARED_STATEMENTS", "0")  # 1 with PgBouncer 1.21+
os.environ["CELERY_BROKER_URL"] = os.environ.get(
    "TEST_REDIS_URL", f"redis://127.0.0.1:6379/{15 - SLOT}"
)
# TEST_CELERY_QUEUE: processes a test starts on a queue of their own (tests/telemetry), so the
# session's workers never take their runs.
os.environ["CELERY_QUEUE"] = os.environ.get("TEST_CELERY_QUEUE", f"agentplatform-test{SLOT or ''}")
os.environ["CELERY_OUTBOX_QUEUE"] = f"{os.environ['CELERY_QUEUE']}-outbox"
# Many tests run with no beat (`no_beat`): no tick backs up a dispatch that gives up waiting for
# the dispatcher's lock on a loaded machine, so the tests' processes wait longer for it.
os.environ.setdefault("DISPATCH_LOCK_WAIT_SECONDS", "5")
os.environ["S3_BUCKET"] = "agentplatform-test"
os.environ["AWS_ACCESS_KEY_ID"] = "agentplatform-test"
os.environ["AWS_SECRET_ACCESS_KEY"] = "agentplatform-test-secret"
SEAWEEDFS_PORT = 18300 + 20 * SLOT
# The session's SeaweedFS (the s3 fixture starts it): without it a call fails on loopback, never
# reaching for AWS itself (the default when no endpoint is set).
os.environ.setdefault("S3_ENDPOINT_URL", f"http://127.0.0.1:{SEAWEEDFS_PORT}")
# Short leases and a quick watchdog, so recovery tests finish in seconds (workers inherit these).
for name, value in {"RUN_LEASE_SECONDS": "3", "RUN_HEARTBEAT_SECONDS": "0.5",
                    "DISPATCH_CHECK_AFTER_SECONDS": "0.5", "DISPATCH_REDELIVER_SECONDS": "3",
                    "DISPATCH_TICK_SECONDS": "0.5", "OUTBOX_BACKOFF_SECONDS": "0.2",
                    "OUTBOX_SWEEP_SECONDS": "0.5", "RUN_UNKNOWN_AGENT_RETRY_SECONDS": "0.3",
                    # longer than the test connectors' 10 s timeout, short enough to expire in a test
                    "OUTBOX_CLAIM_SECONDS": "12",
                    "WEBHOOK_INBOX_SWEEP_SECONDS": "0.5",
                    "WEBHOOK_INBOX_SWEEP_AFTER_SECONDS": "1", "WEBHOOK_INBOX_BACKOFF_SECONDS": "0.2",
                    # the test client and live servers speak plain http
                    "DJANGO_SECURE_SSL_REDIRECT": "0",
                    # tests poll the API every 50 ms; the rate tests set their own rates
                    "API_RATE_PER_KEY": "", "API_RATE_PER_TENANT": "",
                    # the fakes of Slack, Stripe, OpenAI and SMTP listen on loopback
                    "CONNECTOR_ALLOW_PRIVATE_DESTINATIONS": "1"}.items():
    os.environ.setdefault(name, value)
os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(40))
os.environ.setdefault("AGENTPLATFORM_MASTER_KEY", base64.b64encode(os.urandom(32)).decode())
os.environ.setdefault("AGENT_MODULES",
                      "agents,tests.support.agents,tests.support.sandbox_agents,tests.support.engine_agents,"
                      "tests.support.mcp_agents,tests.support.graph_agents")
# Persistent connections, as in production (its default is 60): with 0 every task of every
# worker, the beat's ticks and sweeps among them, opened a connection of its own, and the suite
# took 16 min here instead of 14.
os.environ.setdefault("DATABASE_CONN_MAX_AGE", "60")
os.environ.setdefault("SANDBOX_WORKSPACE_ROOT", os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".dev", f"test-workspaces{SLOT}"))

from agentplatform.settings import *  # noqa: E402,F403

# Short slices in tests so re-enqueueing between slices is exercised by real workers.
RUN_SLICE_SECONDS = float(os.environ.get("RUN_SLICE_SECONDS", "0.5"))

# Argon2id with small costs (tests/support/hashers.py): the suite hashes hundreds of passwords.
PASSWORD_HASHERS = ["tests.support.hashers.QuickArgon2PasswordHasher", *PASSWORD_HASHERS]  # noqa: F405
