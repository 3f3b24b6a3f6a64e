"""Settings: read from the environment (and an optional `.env`), with defaults that run locally.

Every variable is listed in README.md ("Configuration").
"""

import ipaddress
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parents[2]  # platform/agentplatform/ -> the checkout

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env.bool("DJANGO_DEBUG", default=False)
# Required, DEBUG or not: a known fallback would sign sessions anyone can forge. deploy/dev
# writes one into .env for local use.
SECRET_KEY = env("DJANGO_SECRET_KEY", default="")
if not SECRET_KEY:
    raise ImproperlyConfigured(
        "DJANGO_SECRET_KEY is not set: give it a long random value (deploy/dev writes one into "
        ".env for local use)"
    )
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

# -- tenancy: one PostgreSQL schema per tenant (django-tenants) ------------------------------
SHARED_APPS = [
    "tenants",  # before django_tenants so our create_tenant command is the one that runs
    "django_tenants",
    "runs.dispatch",
    "runs.console",  # the founders' console pages across tenants (proxies of Tenant)
    "integrations.webhooks",  # tenant connections and webhook dedupe: found before any schema is set
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # static files of the docs UI at /api/v1/docs
    "django_htmx",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "dashboard",  # the customers' web dashboard at /
    "runs.usage",  # metering and quotas: per tenant, in public
]
TENANT_APPS = [
    "django.contrib.contenttypes",
    "runs",
    "runs.effects",
    "integrations",
    "runs.approvals",
    "runs.retention",
    "runs.definitions",
    "runs.graphs",  # LangGraph checkpoints (agentplatform.langgraph)
    "sandboxes",
]
INSTALLED_APPS = SHARED_APPS + [app for app in TENANT_APPS if app not in SHARED_APPS] + [
    "agentplatform.apps.PlatformConfig",  # the composition root: wires the engine's ports, last
]

TENANT_MODEL = "tenants.Tenant"
TENANT_DOMAIN_MODEL = "tenants.Domain"
PUBLIC_SCHEMA_NAME = "public"
DATABASE_ROUTERS = ["django_tenants.routers.TenantSyncRouter"]

DATABASES = {
    "default": env.db_url(
        "DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/agentplatform"
    )
}
DATABASES["default"]["ENGINE"] = "agentplatform.tenant_database"
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Only statements executed with prepare=True (the engine's checkpoint write) are prepared; a
# huge threshold keeps psycopg from preparing anything else. 0 here: prepare nothing (for a
# pooler without prepared-statement support, e.g. PgBouncer < 1.21 in transaction mode).
if env.bool("DATABASE_PREPARED_STATEMENTS", default=True):
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 2**31 - 1
# DATABASE_URL may be a transaction pool (PgBouncer pool_mode=transaction): the schema is
# selected inside each statement's transaction anyway (agentplatform/tenant_database), but a
# server-side cursor (`.iterator()`) outlives its transaction, so there are none behind one.
DATABASE_POOL_MODE = env.str("DATABASE_POOL_MODE", default="session")
if DATABASE_POOL_MODE not in ("session", "transaction"):
    raise ImproperlyConfigured("DATABASE_POOL_MODE is session (PostgreSQL itself or a session "
                               "pool) or transaction")
DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = DATABASE_POOL_MODE == "transaction"
# PostgreSQL itself (default: DATABASE_URL), for what a transaction pool cannot carry: session
# advisory locks (the one beat, a data key's rotation) and making or dropping databases.
DATABASE_DIRECT = (env.db_url("DATABASE_DIRECT_URL") if env("DATABASE_DIRECT_URL", default="")
                   else DATABASES["default"])
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

MIDDLEWARE = [
    "tenants.middleware.PublicSchemaMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # static files, served by the platform itself
    "agentplatform.limits.RequestSizeLimitMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_otp.middleware.OTPMiddleware",
    "tenants.throttling.AdminLoginThrottleMiddleware",  # the admin's and the dashboard's logins
    "django_htmx.middleware.HtmxMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "agentplatform.urls"
WSGI_APPLICATION = "agentplatform.wsgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "dashboard.context.dashboard",
            ]
        },
    }
]
STATIC_URL = "static/"
# Production collects the static files into STATIC_ROOT (`manage.py collectstatic`, in the image
# or on deploy) and says so with STATIC_COLLECTED=1: whitenoise serves them from there,
# compressed, under content-hashed names cached for good. Without it (development, tests)
# whitenoise serves them from the apps' static folders.
STATIC_ROOT = env("STATIC_ROOT", default=str(BASE_DIR / ".dev" / "static"))
STATIC_COLLECTED = env.bool("STATIC_COLLECTED", default=False)
WHITENOISE_USE_FINDERS = not STATIC_COLLECTED
if STATIC_COLLECTED:
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }

# The dashboard's people: Django users, email as username, passwords hashed with Argon2id.
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",  # accounts made before Argon2 still log in
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
     "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "dashboard:login"
LOGIN_REDIRECT_URL = "dashboard:home"
SESSION_COOKIE_AGE = env.int("SESSION_COOKIE_AGE", default=12 * 3600)
OTP_TOTP_ISSUER = env("OTP_TOTP_ISSUER", default="Agent Platform")
# The dashboard's address in emails (invitations, password resets); empty: the request's host.
DASHBOARD_URL = env("DASHBOARD_URL", default="")
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="Agent Platform <noreply@localhost>")
USE_TZ = True
TIME_ZONE = "UTC"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["tenants.authentication.ApiKeyAuthentication"],
    # every view declares the scopes its methods need (`required_scopes`); none declared: refused
    "DEFAULT_PERMISSION_CLASSES": ["tenants.authentication.IsTenantRequest",
                                   "tenants.authentication.HasRequiredScope"],
    "DEFAULT_THROTTLE_CLASSES": ["tenants.throttling.ApiKeyRateThrottle",
                                 "tenants.throttling.TenantRateThrottle",
                                 "tenants.throttling.TenantPlanRateThrottle"],
    "EXCEPTION_HANDLER": "agentplatform.api_errors.exception_handler",
    # JSON in: a form or multipart body is 415 (the schema documents application/json only)
    "DEFAULT_PARSER_CLASSES": ["agentplatform.parsers.JsonParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Agent Platform API",
    "VERSION": "1",
    "DESCRIPTION": "Every error answers `{\"error\": {\"code\", \"message\"}}`; see docs/api.md.",
    "SERVE_INCLUDE_SCHEMA": False,  # the schema describes the tenant API, not itself
    "COMPONENT_SPLIT_REQUEST": True,  # request bodies as components of their own: non-blank strings
    # the docs UI's scripts and styles are served by the platform (drf-spectacular-sidecar)
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {"AgentKindEnum": ["platform", "tenant"]},  # not approvals' `kind`
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "agentplatform.api_contract.document_common_errors",
    ],
}

# -- limits and rates (docs/api.md#limits) -----------------------------------------------------
# Larger API and webhook bodies are refused unread: 413 request_too_large.
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("REQUEST_MAX_BYTES", default=1024 * 1024)
API_JSON_MAX_DEPTH = env.int("API_JSON_MAX_DEPTH", default=32)  # deeper: 400 json_too_deep
# DRF rates, "<n>/<second|minute|hour|day>"; empty: no limit. Over them: 429 with Retry-After.
API_RATE_PER_KEY = env("API_RATE_PER_KEY", default="1200/minute")
API_RATE_PER_TENANT = env("API_RATE_PER_TENANT", default="3000/minute")
ADMIN_LOGIN_MAX_FAILURES = env.int("ADMIN_LOGIN_MAX_FAILURES", default=5)
ADMIN_LOGIN_LOCKOUT_SECONDS = env.int("ADMIN_LOGIN_LOCKOUT_SECONDS", default=900)
# one username from any address: short, since anyone can fail logins as any username
ADMIN_LOGIN_USERNAME_MAX_FAILURES = env.int("ADMIN_LOGIN_USERNAME_MAX_FAILURES", default=20)
ADMIN_LOGIN_USERNAME_LOCKOUT_SECONDS = env.int("ADMIN_LOGIN_USERNAME_LOCKOUT_SECONDS", default=300)
# Proxies in front of the web server that append to X-Forwarded-For (0: use REMOTE_ADDR).
TRUSTED_PROXY_COUNT = env.int("TRUSTED_PROXY_COUNT", default=0)
# The rates' counters: Redis (the broker's server unless CACHE_URL says otherwise), own prefix.
CACHES = {
    "default": {
        "BACKEND": "agentplatform.cache.RedisCache",
        "LOCATION": env("CACHE_URL", default=env("CELERY_BROKER_URL",
                                                 default=env("REDIS_URL", default="redis://127.0.0.1:6379/0"))),
        "KEY_PREFIX": env("CACHE_KEY_PREFIX", default="agentplatform-cache"),
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
    }
}

# -- HTTPS (docs/operators.md#production-layout) -----------------------------------------------
# Behind a TLS-terminating proxy that sets X-Forwarded-Proto: requests it marks https are secure,
# so redirects, cookies and the webhook URLs given to Slack and Gmail say https.
if env.bool("DJANGO_BEHIND_TLS_PROXY", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Secure unless DEBUG (the dev command serves plain http on loopback).
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=not DEBUG)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]  # load balancers probe over http
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env.bool("DJANGO_SECURE_COOKIES", default=not DEBUG)
SESSION_COOKIE_HTTPONLY = CSRF_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = CSRF_COOKIE_SAMESITE = "Lax"
SECURE_HSTS_SECONDS = env.int("DJANGO_HSTS_SECONDS", default=0 if DEBUG else 365 * 24 * 3600)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", default=True)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_HSTS_PRELOAD", default=False)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

# -- secrets at rest -------------------------------------------------------------------------
# 32 bytes, base64: wraps every tenant's data-encryption key. Never stored in the database.
MASTER_KEY = env("AGENTPLATFORM_MASTER_KEY", default="")

# -- health: /readyz checks PostgreSQL, Redis and S3, each within this many seconds -----------
HEALTH_CHECK_TIMEOUT_SECONDS = env.float("HEALTH_CHECK_TIMEOUT_SECONDS", default=2.0)

# -- S3 (archives, sandbox workspaces); SeaweedFS locally --------------------------------------
S3_ENDPOINT_URL = env("S3_ENDPOINT_URL", default="") or None  # None: AWS itself
S3_BUCKET = env("S3_BUCKET", default="agentplatform")
S3_REGION = env("S3_REGION", default="us-east-1")
# None: boto3's own chain (instance role, ~/.aws). deploy/dev exports its SeaweedFS's pair.
AWS_ACCESS_KEY_ID = env("AWS_ACCESS_KEY_ID", default="") or None
AWS_SECRET_ACCESS_KEY = env("AWS_SECRET_ACCESS_KEY", default="") or None

# -- Celery: Redis is the doorbell, PostgreSQL the truth --------------------------------------
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=env("REDIS_URL", default="redis://127.0.0.1:6379/0"))
CELERY_TASK_DEFAULT_QUEUE = env("CELERY_QUEUE", default="agentplatform")
# Outbox deliveries wait on slow receivers: their own queue and workers, so they never hold the
# slots runs need (docs/decisions/0006-outbox-lease.md). Routed by agentplatform.celery.task_route.
CELERY_OUTBOX_QUEUE = env("CELERY_OUTBOX_QUEUE", default=f"{CELERY_TASK_DEFAULT_QUEUE}-outbox")
# The webhook inbox's retries (`webhooks.*` tasks: the sweep's redeliveries of items whose
# delivery in their request failed); empty: the runs' queue. Production gives them a queue and
# a worker of their own (deploy/production), so a burst of redeliveries never waits behind runs.
CELERY_WEBHOOKS_QUEUE = env("CELERY_WEBHOOKS_QUEUE", default="")
CELERY_TASK_ROUTES = ("agentplatform.celery.task_route",)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = env("CELERY_RESULT_BACKEND", default=CELERY_BROKER_URL)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A task's tenant (its schema header) is looked up once per this many seconds per process, not
# once per task (tenant-schemas-celery); the task only needs its schema, which never changes.
CELERY_TASK_TENANT_CACHE_SECONDS = env.int("CELERY_TENANT_CACHE_SECONDS", default=30)
# A slice lasts RUN_SLICE_SECONDS, far below the visibility timeout, so Redis redelivers only
# what a dead worker held; and a redelivered message only rings the doorbell: the lease claim
# and epoch fencing make a second delivery harmless (docs/decisions/0002-leases.md).
# A broker that hangs (it accepts a connection and never answers: a stopped process, a link
# cut without a reset) fails a send or an ask in one of these on a connection already made; on a
# new one kombu's connect retries (2 s apart, then 4) add theirs: measured 4 s at 1, 6 s at 2,
# 7.5 s at 0.5, and 6 s for a broker that refuses connections, whatever this is. Never forever:
# the request or the worker goes on, and a send that fails leaves its run for the tick.
BROKER_SOCKET_TIMEOUT = env.float("BROKER_SOCKET_TIMEOUT", default=2.0)
# After the broker could not be reached for one of its sends or asks, a process tries no robust
# ring nor ask for this long, and then one caller at a time (agentplatform/doorbell.py): those
# runs are left for the dispatcher's tick.
BROKER_AWAY_SECONDS = env.float("BROKER_AWAY_SECONDS", default=5.0)
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600,
                                   "socket_timeout": BROKER_SOCKET_TIMEOUT,
                                   "socket_connect_timeout": BROKER_SOCKET_TIMEOUT}
# The result backend is never read (ignore_result), but Celery may connect to it: the same.
CELERY_REDIS_SOCKET_TIMEOUT = CELERY_REDIS_SOCKET_CONNECT_TIMEOUT = BROKER_SOCKET_TIMEOUT
CELERY_BEAT_SCHEDULE = {
    "dispatch-tick": {"task": "dispatch.tick",
                      "schedule": env.float("DISPATCH_TICK_SECONDS", default=1.0)},
    "outbox-sweep": {"task": "effects.outbox_sweep",
                     "schedule": env.float("OUTBOX_SWEEP_SECONDS", default=5.0)},
    "webhook-inbox-sweep": {"task": "webhooks.inbox_sweep",
                            "schedule": env.float("WEBHOOK_INBOX_SWEEP_SECONDS", default=5.0)},
    "usage-refresh": {"task": "usage.refresh_all_tenants",
                      "schedule": env.float("USAGE_REFRESH_SECONDS", default=300.0)},
    "retention-archive": {"task": "retention.archive_all_tenants",
                          "schedule": env.float("RETENTION_INTERVAL_SECONDS", default=600.0)},
}
# However many beats run, only the one holding a PostgreSQL session lock ticks
# (agentplatform/beat.py). Its connection: PostgreSQL itself or a session pool, never a
# transaction pool (a session lock there belongs to whichever client borrows the connection).
CELERY_BEAT_SCHEDULER = "agentplatform.beat:OneBeatScheduler"
BEAT_LOCK_DATABASE = (env.db_url("BEAT_LOCK_DATABASE_URL") if env("BEAT_LOCK_DATABASE_URL", default="")
                      else DATABASE_DIRECT)

# The API throttle's per-tenant limit is read again at most this often per process (a changed
# quota applies at once in the process that changed it, within this in the others).
QUOTA_RATE_CACHE_SECONDS = env.float("QUOTA_RATE_CACHE_SECONDS", default=10.0)

# -- runs ------------------------------------------------------------------------------------
RUN_STATE_MAX_BYTES = env.int("RUN_STATE_MAX_BYTES", default=256 * 1024)
# What one step's transition carries besides its state (appended values, a result, a request,
# fan-out items, a child's input, its notifications), as JSON.
RUN_TRANSITION_MAX_BYTES = env.int("RUN_TRANSITION_MAX_BYTES", default=8 * 1024 * 1024)
RUN_SLICE_SECONDS = env.float("RUN_SLICE_SECONDS", default=30.0)
RUN_LEASE_SECONDS = env.float("RUN_LEASE_SECONDS", default=30.0)
RUN_HEARTBEAT_SECONDS = env.float("RUN_HEARTBEAT_SECONDS", default=RUN_LEASE_SECONDS / 3)
# How often a running run's row (steps_taken, active_seconds, updated_at, its lease) is written
# by its checkpoints; the checkpoints between only lock it (FOR SHARE) to fence. What the API
# shows of a running run's counters lags by up to this much; parking and ending write them.
RUN_COUNTERS_SECONDS = env.float("RUN_COUNTERS_SECONDS", default=min(1.0, RUN_LEASE_SECONDS / 4))
# Fair dispatch (dispatch/services.py): how much is handed to workers at once.
DISPATCH_MAX_IN_FLIGHT = env.int("DISPATCH_MAX_IN_FLIGHT", default=16)
RUN_TENANT_MAX_IN_FLIGHT = env.int("RUN_TENANT_MAX_IN_FLIGHT", default=4)
DISPATCH_CHECK_AFTER_SECONDS = env.float("DISPATCH_CHECK_AFTER_SECONDS", default=2.0)
DISPATCH_REDELIVER_SECONDS = env.float("DISPATCH_REDELIVER_SECONDS", default=30.0)
# How long the dispatch after a start or wake-up waits for another dispatcher's lock before
# leaving its runs to the next tick.
DISPATCH_LOCK_WAIT_SECONDS = env.float("DISPATCH_LOCK_WAIT_SECONDS", default=1.0)
AGENT_MODULES = env.list("AGENT_MODULES", default=["agents"])
# Tenant-defined agents (runs/definitions/limits.py): the limits a definition gets for every
# key it leaves unset (max_turns, max_tokens, max_cost_usd, max_wall_seconds; a key set to null
# here has no default). A tenant's own defaults, where set, come between the two.
AGENT_DEFAULT_LIMITS = env.json("AGENT_DEFAULT_LIMITS", default={
    "max_turns": 50, "max_tokens": 500_000, "max_cost_usd": 10.0, "max_wall_seconds": 3600.0})
# A run claimed this many times without a new checkpoint (its step kills the worker: OOM,
# segfault, os._exit) is parked for a person on its next claim; a branch fails.
RUN_MAX_CLAIMS_WITHOUT_CHECKPOINT = env.int("RUN_MAX_CLAIMS_WITHOUT_CHECKPOINT", default=3)
# Rolling deploys: a worker without a run's agent version hands it back, in line again after
# RETRY seconds for a worker that has it; after GRACE seconds of that, the run is parked.
RUN_UNKNOWN_AGENT_RETRY_SECONDS = env.float("RUN_UNKNOWN_AGENT_RETRY_SECONDS", default=5.0)
RUN_UNKNOWN_AGENT_GRACE_SECONDS = env.float("RUN_UNKNOWN_AGENT_GRACE_SECONDS", default=1800.0)
# Durability "async": at most this many checkpoint writes in flight; the step loop then waits.
RUN_ASYNC_MAX_PENDING_WRITES = env.int("RUN_ASYNC_MAX_PENDING_WRITES", default=8)
# Outbox delivery: at least once, with exponential backoff, then marked failed.
OUTBOX_MAX_ATTEMPTS = env.int("OUTBOX_MAX_ATTEMPTS", default=8)
OUTBOX_BACKOFF_SECONDS = env.float("OUTBOX_BACKOFF_SECONDS", default=2.0)

# -- retention: finished runs are archived to S3 after their TTL, then pruned -----------------
# Objects go to <RETENTION_S3_PREFIX>/<schema>/archives/<run id>[.<sha256 prefix>].jsonl.gz.enc in
# S3_BUCKET (docs/retention.md).
# Agents may declare their own policy (runs.agents.RetentionPolicy); these are the defaults.
RETENTION_S3_PREFIX = env("RETENTION_S3_PREFIX", default="tenants")
RETENTION_HISTORY = env("RETENTION_HISTORY", default="full")  # or "shallow"
RETENTION_TTL_DAYS = env.float("RETENTION_TTL_DAYS", default=30.0)
RETENTION_ARCHIVE_REQUIRED = env.bool("RETENTION_ARCHIVE_REQUIRED", default=True)
RETENTION_BATCH_SIZE = env.int("RETENTION_BATCH_SIZE", default=1000)  # runs per tenant per pass
# Runs archived in one transaction (their row locks held together while they upload), and
# uploads in flight at once (threads sharing one S3 client).
RETENTION_CHUNK_SIZE = env.int("RETENTION_CHUNK_SIZE", default=100)
RETENTION_UPLOAD_CONCURRENCY = env.int("RETENTION_UPLOAD_CONCURRENCY", default=8)

# -- sandboxes: bubblewrap jails for tenant code (docs/sandboxes.md) ---------------------------
SANDBOX_BWRAP = env("SANDBOX_BWRAP", default="bwrap")
# Local working copies of run workspaces; the durable copy is the encrypted snapshot in S3.
SANDBOX_WORKSPACE_ROOT = env("SANDBOX_WORKSPACE_ROOT", default=str(BASE_DIR / ".dev" / "workspaces"))
# Host uid bwrap runs as; -1: the worker's own, or 65534 (nobody) when the worker is root.
SANDBOX_HOST_UID = env.int("SANDBOX_HOST_UID", default=-1)
SANDBOX_TIMEOUT_SECONDS = env.float("SANDBOX_TIMEOUT_SECONDS", default=60.0)
SANDBOX_TIMEOUT_MAX_SECONDS = env.float("SANDBOX_TIMEOUT_MAX_SECONDS", default=900.0)
SANDBOX_CPU_SECONDS = env.int("SANDBOX_CPU_SECONDS", default=60)
SANDBOX_MEMORY_BYTES = env.int("SANDBOX_MEMORY_BYTES", default=1024 * 1024 * 1024)
SANDBOX_PROCESSES = env.int("SANDBOX_PROCESSES", default=64)
SANDBOX_OPEN_FILES = env.int("SANDBOX_OPEN_FILES", default=256)
SANDBOX_FILE_SIZE_BYTES = env.int("SANDBOX_FILE_SIZE_BYTES", default=64 * 1024 * 1024)
SANDBOX_WORKSPACE_MAX_BYTES = env.int("SANDBOX_WORKSPACE_MAX_BYTES", default=256 * 1024 * 1024)
SANDBOX_TMP_BYTES = env.int("SANDBOX_TMP_BYTES", default=64 * 1024 * 1024)
SANDBOX_OUTPUT_MAX_BYTES = env.int("SANDBOX_OUTPUT_MAX_BYTES", default=64 * 1024)
# Entries (files, directories, links) a workspace may hold; apparent bytes: WORKSPACE_MAX_BYTES.
SANDBOX_WORKSPACE_MAX_FILES = env.int("SANDBOX_WORKSPACE_MAX_FILES", default=10_000)
# How deep a workspace may nest directories (host-side walks hold one descriptor per level).
SANDBOX_WORKSPACE_MAX_DEPTH = env.int("SANDBOX_WORKSPACE_MAX_DEPTH", default=64)
# CPUs a jail may use at once (its cgroup's CPU quota), beside RLIMIT_CPU's total seconds.
SANDBOX_CPUS = env.float("SANDBOX_CPUS", default=1.0)
# Jail cgroups go under this cgroup (a path in the hierarchy); "": v1 the worker's own, v2 its
# parent. A host with no usable cgroups refuses jails unless SANDBOX_ALLOW_NO_CGROUPS.
SANDBOX_CGROUP_PARENT = env("SANDBOX_CGROUP_PARENT", default="")
SANDBOX_ALLOW_NO_CGROUPS = env.bool("SANDBOX_ALLOW_NO_CGROUPS", default=False)
# The parts of /usr bound (read-only) into a jail; never /usr/local or /usr/src.
SANDBOX_USR_DIRS = env.list("SANDBOX_USR_DIRS", default=[
    "bin", "sbin", "lib", "lib32", "lib64", "libx32", "libexec",
    "share/zoneinfo", "share/ca-certificates", "share/misc"])
# Concurrent egress-proxy connections one sandbox call may hold open.
SANDBOX_EGRESS_MAX_CONNECTIONS = env.int("SANDBOX_EGRESS_MAX_CONNECTIONS", default=16)

# -- connectors: how effects reach the world (docs/connectors.md) ----------------------------
# Per-tenant credentials (integrations.Credential) override these; these suit one deployment.
CONNECTOR_TIMEOUT_SECONDS = env.float("CONNECTOR_TIMEOUT_SECONDS", default=30.0)
# How long an outbox delivery is claimed for: longer than any connector call (and a lookup),
# so a live claim is never taken over; an expired one means its deliverer died.
OUTBOX_CLAIM_SECONDS = env.float("OUTBOX_CLAIM_SECONDS", default=2 * CONNECTOR_TIMEOUT_SECONDS + 30)
# Tenant-supplied URLs and SMTP hosts must resolve only to public addresses and use one of these
# ports (SSRF; docs/connectors.md). Hosts from the settings below are the operator's: trusted.
CONNECTOR_HTTP_PORTS = [int(port) for port in env.list("CONNECTOR_HTTP_PORTS", default=["80", "443"])]
CONNECTOR_SMTP_PORTS = [int(port) for port in env.list("CONNECTOR_SMTP_PORTS",
                                                       default=["25", "465", "587"])]
# Development and tests only: tenant destinations may be private and on any port (the fakes of
# Slack, Stripe, OpenAI and SMTP listen on loopback at free ports). Never in production.
CONNECTOR_ALLOW_PRIVATE_DESTINATIONS = env.bool("CONNECTOR_ALLOW_PRIVATE_DESTINATIONS",
                                                default=False)
EMAIL_HOST = env("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_HOST_USER = env("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
EMAIL_USE_SSL = env.bool("EMAIL_USE_SSL", default=False)
EMAIL_TIMEOUT = CONNECTOR_TIMEOUT_SECONDS
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="agentplatform@localhost")
EMAIL_MESSAGE_ID_DOMAIN = env("EMAIL_MESSAGE_ID_DOMAIN", default="agentplatform.invalid")
SLACK_API_URL = env("SLACK_API_URL", default="https://slack.com/api")
# Reconciling a Slack message: how far back, and how many history pages, to search for its key.
SLACK_LOOKUP_WINDOW_SECONDS = env.float("SLACK_LOOKUP_WINDOW_SECONDS", default=7 * 24 * 3600.0)
SLACK_LOOKUP_MAX_PAGES = env.int("SLACK_LOOKUP_MAX_PAGES", default=10)
# One MCP tool call, session and all (connect, initialize, the call, its answer)
MCP_TIMEOUT_SECONDS = env.float("MCP_TIMEOUT_SECONDS", default=CONNECTOR_TIMEOUT_SECONDS)
STRIPE_API_URL = env("STRIPE_API_URL", default="https://api.stripe.com")
OPENAI_BASE_URL = env("OPENAI_BASE_URL", default="https://api.openai.com/v1")
# for model credentials with api_format "anthropic" and no base_url of their own
ANTHROPIC_BASE_URL = env("ANTHROPIC_BASE_URL", default="https://api.anthropic.com")
# Anthropic requires max_tokens; used when a call gives none
ANTHROPIC_MAX_TOKENS_DEFAULT = env.int("ANTHROPIC_MAX_TOKENS_DEFAULT", default=4096)
# USD per 1,000 tokens, (input, output), by model; MODEL_PRICE_DEFAULT for any other model.
MODEL_PRICES = {name: tuple(price) for name, price in env.json("MODEL_PRICES", default={
    "gpt-4o": [0.0025, 0.01],
    "gpt-4o-mini": [0.00015, 0.0006],
    "gpt-4.1": [0.002, 0.008],
    "gpt-4.1-mini": [0.0004, 0.0016],
    "claude-sonnet-4-5": [0.003, 0.015],
    "claude-haiku-4-5": [0.001, 0.005],
}).items()}
MODEL_PRICE_DEFAULT = tuple(env.json("MODEL_PRICE_DEFAULT", default=[0.01, 0.03]))

# -- webhooks: Slack and Gmail (docs/webhooks.md) ------------------------------------------------
SLACK_TIMESTAMP_WINDOW_SECONDS = env.int("SLACK_TIMESTAMP_WINDOW_SECONDS", default=300)
# Google's signing keys for Pub/Sub push OIDC tokens (JWKS), fetched with a timeout and cached.
GOOGLE_OIDC_CERTS_URL = env("GOOGLE_OIDC_CERTS_URL", default="https://www.googleapis.com/oauth2/v3/certs")
# A JWKS (JSON text) trusted instead of fetching GOOGLE_OIDC_CERTS_URL: tests, air-gapped setups.
GOOGLE_OIDC_JWKS = env("GOOGLE_OIDC_JWKS", default="")
GOOGLE_OIDC_FETCH_TIMEOUT_SECONDS = env.float("GOOGLE_OIDC_FETCH_TIMEOUT_SECONDS", default=3.0)
GOOGLE_OIDC_CACHE_SECONDS = env.int("GOOGLE_OIDC_CACHE_SECONDS", default=3600)
# The webhook inbox (docs/webhooks.md): the sweep delivers items whose doorbell was lost once
# they are this old; a failed delivery is retried after BACKOFF * 2^attempts, at most MAX.
WEBHOOK_INBOX_SWEEP_AFTER_SECONDS = env.float("WEBHOOK_INBOX_SWEEP_AFTER_SECONDS", default=10.0)
WEBHOOK_INBOX_BACKOFF_SECONDS = env.float("WEBHOOK_INBOX_BACKOFF_SECONDS", default=2.0)
WEBHOOK_INBOX_BACKOFF_MAX_SECONDS = env.float("WEBHOOK_INBOX_BACKOFF_MAX_SECONDS", default=300.0)
# After this many failed deliveries an item is `failed` (its error as outcome) and no longer
# retried; the retention job deletes it like a delivered one.
WEBHOOK_INBOX_MAX_ATTEMPTS = env.int("WEBHOOK_INBOX_MAX_ATTEMPTS", default=20)
# An event nobody waits for is kept this long for a wait that begins before it arrives
# (docs/api.md#events); after that it never wakes a run.
EVENT_BUFFER_SECONDS = env.float("EVENT_BUFFER_SECONDS", default=24 * 3600.0)
# The retention job deletes dedupe rows (Slack/Gmail delivery ids, delivered inbox items, inbound
# events) older than this: longer than the senders retry (Pub/Sub keeps messages 7 days).
EVENT_DEDUPE_RETENTION_SECONDS = env.float("EVENT_DEDUPE_RETENTION_SECONDS",
                                           default=8 * 24 * 3600.0)

# -- telemetry (docs/operators.md#metrics-and-traces) ------------------------------------------
# Tracing and OTLP export follow OTEL_EXPORTER_OTLP_ENDPOINT (read by the SDK itself). Spans as
# JSON lines, a file per process in this directory: for development and tests, not production.
TELEMETRY_SPANS_DIR = env("TELEMETRY_SPANS_DIR", default="")
# A request's own traceparent/tracestate/baggage headers are dropped (anyone can send them): on,
# they are kept and the request's trace continues the caller's (only behind your own services).
TELEMETRY_TRUST_INCOMING_TRACE = env.bool("TELEMETRY_TRUST_INCOMING_TRACE", default=False)
# Off unless asked: `/metrics` (Prometheus text) in web processes, and a port per Celery worker
# process (METRICS_WORKER_PORT + pool index; 0: none), bound to METRICS_WORKER_ADDR.
METRICS_PROMETHEUS = env.bool("METRICS_PROMETHEUS", default=False)
METRICS_WORKER_PORT = env.int("METRICS_WORKER_PORT", default=0)
METRICS_WORKER_ADDR = env("METRICS_WORKER_ADDR", default="127.0.0.1")
# Who may scrape: a bearer token, or an address in these networks. Behind a reverse proxy every
# client looks like the proxy, so production (DEBUG off) trusts no network unless told: set a
# token. The metrics carry no tenant names, but the fleet's size and load are nobody's business.
METRICS_TOKEN = env("METRICS_TOKEN", default="")
METRICS_ALLOWED_NETWORKS = env.list("METRICS_ALLOWED_NETWORKS",
                                    default=["127.0.0.0/8", "::1/128"] if DEBUG else [])
for _network in METRICS_ALLOWED_NETWORKS:
    try:
        ipaddress.ip_network(_network, strict=False)
    except ValueError:
        raise ImproperlyConfigured(
            f"METRICS_ALLOWED_NETWORKS: {_network!r} is not a network (e.g. 10.0.0.0/8)") from None
if (METRICS_PROMETHEUS or METRICS_WORKER_PORT) and not (METRICS_TOKEN or METRICS_ALLOWED_NETWORKS):
    raise ImproperlyConfigured(
        "METRICS_PROMETHEUS or METRICS_WORKER_PORT is set but nobody may scrape: set METRICS_TOKEN "
        "(a long random value) or METRICS_ALLOWED_NETWORKS")
# A fleet gauge (ready list, outbox backlog) is read from the database at most this often.
METRICS_GAUGE_CACHE_SECONDS = env.float("METRICS_GAUGE_CACHE_SECONDS", default=15.0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    # credentials and secret URL parts never reach a log line (agentplatform/redaction.py)
    "filters": {"secrets": {"()": "agentplatform.redaction.SecretsRedactingFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain",
                             "filters": ["secrets"]}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
    # the MCP client logs every request's URL and session id at INFO: a tenant's, not ours
    "loggers": {name: {"level": "WARNING"} for name in ("httpx2", "httpcore2", "mcp")},
}
