"""Health endpoints for load balancers and orchestrators: `/healthz` (the process answers) and
`/readyz` (PostgreSQL, Redis and S3 reachable). No authentication, and nothing in the body but
ok/failing per dependency: no exception text, hostnames or versions. Each check has its own
short timeout and they run at once, so a dead dependency answers 503 within about one timeout."""

import logging
from concurrent.futures import ThreadPoolExecutor

import boto3
import psycopg
import redis
from botocore.config import Config
from django.conf import settings
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

log = logging.getLogger(__name__)


def postgres_check(timeout: float) -> None:
    """A new connection answers a query within `timeout`. The statement timeout is set in the
    query's transaction, not as a startup option: PgBouncer refuses unknown startup options."""
    db = settings.DATABASES["default"]
    with psycopg.connect(host=db.get("HOST") or "127.0.0.1", port=db.get("PORT") or 5432,
                         dbname=db["NAME"], user=db.get("USER") or None,
                         password=db.get("PASSWORD") or None,
                         connect_timeout=max(1, round(timeout))) as conn:
        conn.execute(f"SET LOCAL statement_timeout = {int(timeout * 1000)}")
        conn.execute("SELECT 1")


def redis_check(timeout: float) -> None:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=timeout,
                                  socket_timeout=timeout)
    try:
        client.ping()
    finally:
        client.close()


def s3_check(timeout: float) -> None:
    client = boto3.client(
        "s3", endpoint_url=settings.S3_ENDPOINT_URL, region_name=settings.S3_REGION,
        aws_access_key_id=settings.AWS_ACCESS_KEY_ID,
        aws_secret_access_key=settings.AWS_SECRET_ACCESS_KEY,
        config=Config(connect_timeout=timeout, read_timeout=timeout,
                      retries={"max_attempts": 1, "mode": "standard"}))
    client.head_bucket(Bucket=settings.S3_BUCKET)


CHECKS = {"postgres": postgres_check, "redis": redis_check, "s3": s3_check}


def _outcome(name: str, timeout: float) -> str:
    try:
        CHECKS[name](timeout)
        return "ok"
    except Exception as exc:  # any failure is "failing"; the reason goes to the log only
        log.warning("readiness check %s failing: %s", name, type(exc).__name__)
        return "failing"


@never_cache
@require_GET
def healthz(request):
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request):
    timeout = settings.HEALTH_CHECK_TIMEOUT_SECONDS
    with ThreadPoolExecutor(max_workers=len(CHECKS)) as pool:
        futures = {name: pool.submit(_outcome, name, timeout) for name in CHECKS}
        results = {name: future.result() for name, future in futures.items()}
    ready = all(value == "ok" for value in results.values())
    return JsonResponse({"status": "ok" if ready else "failing", **results},
                        status=200 if ready else 503)
