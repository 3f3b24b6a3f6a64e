"""A throwaway platform for benchmarks that need real workers: the bench database made anew,
a Redis db and queues of its own, beat, N worker processes and an outbox worker."""

import contextlib
import os
import tempfile
from pathlib import Path

from agentplatform import localprocs

BENCH_REDIS = "redis://127.0.0.1:6379/13"


class BenchPlatform:
    def __init__(self, *, env: dict, workers: int, concurrency: int = 1):
        self.env = {**env, "CELERY_BROKER_URL": os.environ.get("BENCH_REDIS_URL", BENCH_REDIS),
                    "CELERY_QUEUE": "agentplatform-bench",
                    "CELERY_OUTBOX_QUEUE": "agentplatform-bench-outbox"}
        self.count, self.concurrency = workers, concurrency
        self.workers: list[localprocs.Worker] = []
        self.wait_for = localprocs.wait_for
        self._serial = 0

    def __enter__(self):
        import redis
        from django.conf import settings

        from bench.database import bench_database_prepare

        os.environ.update(self.env)
        settings.CELERY_BROKER_URL = self.env["CELERY_BROKER_URL"]
        settings.CELERY_TASK_DEFAULT_QUEUE = self.env["CELERY_QUEUE"]
        settings.CELERY_OUTBOX_QUEUE = self.env["CELERY_OUTBOX_QUEUE"]
        from agentplatform.celery import app

        app.conf.broker_url = self.env["CELERY_BROKER_URL"]
        app.conf.task_default_queue = self.env["CELERY_QUEUE"]
        redis.Redis.from_url(self.env["CELERY_BROKER_URL"]).flushdb()
        bench_database_prepare()
        self.dir = Path(tempfile.mkdtemp(prefix="bench-"))
        self.logs = self.dir / "logs"
        self.beat = localprocs.Beat(self.dir, log_dir=self.logs, env=self.env)
        # deliveries have their own queue and worker: slow receivers never hold run slots
        self.outbox = localprocs.Worker.outbox("bench-outbox", log_dir=self.logs, env=self.env)
        for _ in range(self.count):
            self.workers.append(self._start())
        for worker in [*self.workers, self.outbox]:
            worker.wait_ready()
        return self

    def _start(self) -> localprocs.Worker:
        self._serial += 1
        return localprocs.Worker(f"bench-{self._serial}", self.concurrency, log_dir=self.logs,
                                 env=self.env)

    @contextlib.contextmanager
    def tenant(self, schema: str):
        from django_tenants.utils import tenant_context

        from tenants.services import tenant_create

        with tenant_context(tenant_create(schema_name=schema).tenant):
            yield

    def worker_of(self, pid: int) -> localprocs.Worker | None:
        return next((w for w in self.workers if pid in w.pids()), None)

    def replace(self, dead: localprocs.Worker) -> None:
        self.workers.remove(dead)
        fresh = self._start().wait_ready()
        self.workers.append(fresh)

    def __exit__(self, *exc):
        from django.db import connections

        for process in [*self.workers, self.outbox, self.beat]:
            process.stop()
        connections.close_all()
        print(f"(process logs in {self.logs})")
