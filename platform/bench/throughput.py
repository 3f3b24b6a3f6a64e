"""`python -m bench throughput`: many tenants' runs at once, through the REST API, the broker and
real workers; DBOS's queue, same shape, as the peer.

Ours: real Celery workers (`--workers` processes × `--concurrency` slots, and as many runs
handed out at once: DISPATCH_MAX_IN_FLIGHT, `--in-flight`) and beat (`BenchPlatform`), and
gunicorn with the production settings (deploy/production) for the API, on a database, Redis db
and queue of the bench's own (by BENCH_SLOT, else TEST_SLOT). `--tenants` tenants are made,
each with its API key; then one process per tenant POSTs `--runs` runs of the agent
`bench_throughput` (`--steps` steps each, every step a checkpoint in `sync` durability) to
/api/v1/runs, all tenants at once, each over one kept-alive connection (as an API client's
session does; DBOSClient keeps its database connection likewise).

DBOS (`bench.throughput_dbos`): the same number of worker processes, each launching DBOS with
one queue whose worker concurrency is our slots per process and whose global concurrency is
our slots in all; one process per "tenant" enqueues `--runs` workflows of `--steps`
`@DBOS.step`s each with DBOSClient.

Measured from the first POST (enqueue) to the last run finished:
  steps_per_s      runs × steps ÷ that time
  p50/p99 run      from a run's POST (enqueue) to its end (finished_at; DBOS: updated_at)
  cpu_ms_per_step  CPU time (utime + stime from /proc/<pid>/stat, reaped children's too) of
                   every worker process, main and pool, over that time ÷ steps
  pg_tx_per_step   xact_commit + xact_rollback of the bench database (pg_stat_database, read
                   from another database after every process of the bench has closed its
                   connection, so each backend has flushed its counts) ÷ steps; the bench's
                   own progress polls (one transaction each) are left out
  tenant_spread    the largest tenant's median run time ÷ the smallest's
Ends with one line:
`throughput: tenants=<n> runs=<n> steps_per_s=<x> vs_dbos=<ratio> cpu_ms_per_step=<ms>
pg_tx_per_step=<x> p99_run_s=<s> tenant_spread=<ratio>`
"""

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.database import slot_environment
from runs.agents import Agent
from runs.transitions import finish, goto

OWN_DJANGO_SETUP = True  # it picks its own database, Redis db and queue (by slot)
ROOT = Path(__file__).resolve().parents[2]  # platform/<package>/ -> the checkout
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

loop = Agent("bench_throughput", version=1)


@loop.step(start=True, next=["work"])
def work(ctx, state):
    n = state.get("n", 0) + 1
    if n >= state["steps"]:
        return finish(n)
    return goto("work", update={"n": n})


@dataclass
class Measured:
    """One system's pass: what the closing line and the detail line are made of."""

    system: str
    tenants: int
    runs: int
    steps: int
    seconds: float
    post_seconds: float  # from the first POST (enqueue) to the last one answered
    run_seconds: dict[str, list[float]]  # tenant -> each run's POST-to-end time
    cpu_seconds: float
    transactions: int

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds

    @property
    def cpu_ms_per_step(self) -> float:
        return 1000 * self.cpu_seconds / self.steps

    @property
    def tx_per_step(self) -> float:
        return self.transactions / self.steps

    def percentile(self, p: float) -> float:
        ordered = sorted(s for times in self.run_seconds.values() for s in times)
        return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]

    @property
    def spread(self) -> float:
        medians = [statistics.median(times) for times in self.run_seconds.values()]
        return max(medians) / min(medians)

    def line(self) -> str:
        return (f"{self.system}: tenants={self.tenants} runs={self.runs} steps={self.steps} "
                f"seconds={self.seconds:.2f} posting_s={self.post_seconds:.2f} "
                f"steps_per_s={self.steps_per_s:.0f} p50_run_s={self.percentile(50):.2f} "
                f"p99_run_s={self.percentile(99):.2f} cpu_ms_per_step={self.cpu_ms_per_step:.2f} "
                f"pg_tx_per_step={self.tx_per_step:.2f} tenant_spread={self.spread:.2f}")


def median_round(rounds: list[tuple[Measured, Measured | None]]
                 ) -> tuple[Measured, Measured | None]:
    """The round whose ratio (ours ÷ DBOS, each pair measured one right after the other) is the
    median (of an even number, the lower middle); without DBOS, that of our median steps/s.
    The machine's speed drifts by tens of percent over minutes here (a VM): a ratio of one
    pair, or of two medians taken apart, would carry that drift."""
    def key(pair: tuple[Measured, Measured | None]) -> float:
        ours, dbos = pair
        return ours.steps_per_s / dbos.steps_per_s if dbos else ours.steps_per_s
    return sorted(rounds, key=key)[(len(rounds) - 1) // 2]  # of two middle ones, the lower


def closing_line(ours: Measured, dbos: Measured | None) -> str:
    vs = f"{ours.steps_per_s / dbos.steps_per_s:.2f}" if dbos else "n/a"
    return (f"throughput: tenants={ours.tenants} runs={ours.runs} "
            f"steps_per_s={ours.steps_per_s:.0f} vs_dbos={vs} "
            f"cpu_ms_per_step={ours.cpu_ms_per_step:.2f} pg_tx_per_step={ours.tx_per_step:.2f} "
            f"p99_run_s={ours.percentile(99):.2f} tenant_spread={ours.spread:.2f}")


# -- what both systems share -----------------------------------------------------------------------
def cpu_seconds(pids) -> float:
    """utime + stime of the processes, with their reaped children's (cutime + cstime)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / CLOCK_TICKS


def transactions(dsn_of_postgres: str, dbname: str) -> int:
    """Committed and rolled-back transactions of `dbname`, read from another database."""
    import psycopg

    with psycopg.connect(dsn_of_postgres, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                            "WHERE datname = %s", [dbname]).fetchone()[0]


def settled_transactions(dsn_of_postgres: str, dbname: str, *, connected) -> int:
    """The count once no backend of `dbname` is left to flush its own (`connected()` is how
    many still are): a backend reports its counts when it exits, or when idle a while."""
    deadline = time.monotonic() + 15
    while connected() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)
    return transactions(dsn_of_postgres, dbname)


def backends(dsn_of_postgres: str, dbname: str) -> int:
    import psycopg

    with psycopg.connect(dsn_of_postgres, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                            [dbname]).fetchone()[0]


def posters_run(post, tenants: list, runs: int) -> tuple[dict[str, list[tuple[str, float]]], float]:
    """One process per tenant, all released at once; each calls `post(tenant, i)` `runs` times
    and reports (run key, time sent). Returns them by tenant, and the time the last answered.

    Plain os.fork: multiprocessing's after-fork hooks would close the parent's broker
    connections from the child (kombu), which blocks."""
    go_read, go_write = os.pipe()
    children = []
    for tenant in tenants:
        result_read, result_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: only HTTP (or DBOSClient) from here, then _exit
            code = 0
            try:
                os.close(go_write)
                os.read(go_read, 1)
                sent = []
                for i in range(runs):
                    started = time.time()
                    sent.append((post(tenant, i), started))
                answer = {"sent": sent, "ended": time.time()}
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                answer, code = {"error": f"{type(exc).__name__}: {exc}"}, 1
            with os.fdopen(result_write, "w") as f:
                json.dump(answer, f)
            os._exit(code)
        os.close(result_write)
        children.append((tenant if isinstance(tenant, str) else tenant[0], pid, result_read))
    os.close(go_read)
    time.sleep(0.2)  # every child waits on the pipe
    os.close(go_write)  # releases them all at once (end of file)
    by_tenant, last, errors = {}, 0.0, []
    for name, pid, result_read in children:
        with os.fdopen(result_read) as f:
            answer = json.load(f)
        os.waitpid(pid, 0)
        if "error" in answer:
            errors.append(f"{name}: {answer['error']}")
            continue
        by_tenant[name] = [tuple(pair) for pair in answer["sent"]]
        last = max(last, answer["ended"])
    if errors:
        raise RuntimeError(f"posters failed: {errors}")
    return by_tenant, last


# -- ours ----------------------------------------------------------------------------------------
class Gunicorn:
    """The API as production serves it: deploy/production/gunicorn.conf.py (gthread)."""

    def __init__(self, port: int, env: dict, log: Path):
        self.port = port
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "deploy/production/gunicorn.conf.py",
             "--access-logfile", "/dev/null"],
            cwd=ROOT, env={**os.environ, **env, "DJANGO_SETTINGS_MODULE": "bench.settings",
                           "WEB_BIND": f"127.0.0.1:{port}"},
            stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)

    def pids(self) -> set[int]:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        found = {self.process.pid}
        if children.exists():
            found |= {int(pid) for pid in children.read_text().split()}
        return found

    def wait_ready(self, wait_for):
        def answers():
            assert self.process.poll() is None, "gunicorn exited"
            try:
                return run_post(self.port, "", {}) == 401
            except OSError:
                return False

        wait_for(answers, timeout=60, interval=0.2, what="gunicorn to answer")

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=30)


_kept_alive: dict[int, http.client.HTTPConnection] = {}  # a posting process's connection


def run_post(port: int, api_key: str, body: dict, *, keep_alive: bool = False) -> int | str:
    """POST /api/v1/runs: the new run's id, or the status when it is not 201. `keep_alive`: on
    this process's one connection to the port, as an API client's session would (gunicorn's
    gthread workers keep it open between requests); else on a connection of its own."""
    conn = _kept_alive.get(port) if keep_alive else None
    if conn is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        if keep_alive:
            _kept_alive[port] = conn
    try:
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        conn.request("POST", "/api/v1/runs", json.dumps(body), headers)
        response = conn.getresponse()
        answer = response.read()
        if response.status != 201:
            if api_key:
                raise RuntimeError(f"POST /api/v1/runs: {response.status} {answer[:300]!r}")
            return response.status
        return json.loads(answer)["id"]
    except BaseException:  # never sent again here (a POST is not idempotent): the bench fails
        _kept_alive.pop(port, None)
        conn.close()
        raise
    finally:
        if not keep_alive:
            conn.close()


def runs_finished(conn, schemas: list[str]) -> dict[str, float]:
    """Run id -> finished_at (epoch seconds) of every finished run, over the tenants' schemas."""
    union = " UNION ALL ".join(
        f'SELECT id::text, extract(epoch FROM finished_at)::float8, status FROM "{s}".runs_run '
        "WHERE finished_at IS NOT NULL" for s in schemas)
    rows = conn.execute(union).fetchall()
    failed = [(run, status) for run, _, status in rows if status != "succeeded"]
    if failed:
        raise RuntimeError(f"{len(failed)} runs did not succeed, e.g. {failed[:3]}")
    return {run: finished for run, finished, _ in rows}


def ours_run(args, out) -> Measured:
    import psycopg
    from django.db import connections

    from bench.database import server_dsn
    from bench.platform import BenchPlatform
    from tenants.services import tenant_create

    slot = int(os.environ.get("BENCH_SLOT", "0"))
    env = {"AGENT_MODULES": "agents,bench.throughput",
           "DISPATCH_MAX_IN_FLIGHT": str(args.in_flight or args.workers * args.concurrency)}
    os.environ.update(env)
    platform = BenchPlatform(env=env, workers=args.workers, concurrency=args.concurrency)
    platform.env["CELERY_QUEUE"] = os.environ.get("BENCH_QUEUE",
                                                  f"agentplatform-bench-throughput{slot}")
    platform.env["CELERY_OUTBOX_QUEUE"] = platform.env["CELERY_QUEUE"] + "-outbox"
    dbname = os.environ["DATABASE_DIRECT_URL"].rsplit("/", 1)[1]
    admin_dsn = server_dsn("postgres")
    with platform:
        if args.log_statements:  # sessions opened from here on log every statement
            with psycopg.connect(admin_dsn, autocommit=True) as admin:
                admin.execute(f'ALTER DATABASE "{dbname}" SET log_min_duration_statement = 0')
        keys = {}
        for i in range(args.tenants):
            schema = f"tp{i + 1}"
            keys[schema] = tenant_create(schema_name=schema).api_key
        web = Gunicorn(args.port or 18885 + slot, platform.env, platform.logs / "gunicorn.log")
        try:
            web.wait_ready(platform.wait_for)
            poll = psycopg.connect(server_dsn(dbname), autocommit=True)
            schemas = list(keys)
            # Warm-up: a run per tenant (connections, imports, prepared statements), unmeasured.
            for key in keys.values():
                run_post(web.port, key, {"agent": "bench_throughput", "input": {"steps": 2}})
            platform.wait_for(lambda: len(runs_finished(poll, schemas)) >= len(keys),
                              timeout=120, interval=0.1, what="the warm-up runs")
            warm = set(runs_finished(poll, schemas))
            connections.close_all()  # this process takes no part from here on
            time.sleep(args.settle)  # idle backends report their counts (after 10 s)
            workers = [p for w in platform.workers for p in w.pids()]
            tx_before, cpu_before = transactions(admin_dsn, dbname), cpu_seconds(workers)
            web_before = cpu_seconds(web.pids())
            body = {"agent": "bench_throughput", "input": {"steps": args.steps}}
            port = web.port
            by_tenant, posted_at = posters_run(
                lambda tenant, i: run_post(port, keys[tenant], body, keep_alive=True), schemas,
                args.runs)
            first = min(sent for runs in by_tenant.values() for _, sent in runs)
            total, polls = args.tenants * args.runs, 0
            deadline = time.monotonic() + args.deadline
            while True:
                finished = runs_finished(poll, schemas)
                polls += 1
                if len(finished) - len(warm) >= total:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{len(finished) - len(warm)} of {total} runs finished "
                                       f"in {args.deadline}s")
                time.sleep(0.2)
            cpu_used = cpu_seconds(workers) - cpu_before
            web_cpu = cpu_seconds(web.pids()) - web_before
            poll.close()
        finally:
            web.stop()
    # every process of ours has stopped: its backend reported its counts on the way out
    tx = settled_transactions(admin_dsn, dbname, connected=lambda: backends(admin_dsn, dbname))
    last = max(finished.values())
    times = {tenant: [finished[run] - sent for run, sent in runs]
             for tenant, runs in by_tenant.items()}
    measured = Measured(system="ours", tenants=args.tenants, runs=total, steps=total * args.steps,
                        seconds=last - first, post_seconds=posted_at - first, run_seconds=times,
                        cpu_seconds=cpu_used, transactions=tx - tx_before - polls)
    print(f"  (ours: {args.workers} workers x {args.concurrency}; web CPU "
          f"{1000 * web_cpu / measured.steps:.2f} ms/step, not counted)", file=out)
    return measured


# -- DBOS ----------------------------------------------------------------------------------------
def dbos_run(args, out) -> Measured:
    from bench.database import database_drop, database_recreate, server_dsn, server_url
    from bench.throughput_dbos import QUEUE, WORKFLOW, workflows_finished

    slot = int(os.environ.get("BENCH_SLOT", "0"))
    dbname = f"{os.environ['DATABASE_DIRECT_URL'].rsplit('/', 1)[1]}_dbos"
    admin_dsn, url = server_dsn("postgres"), server_url(dbname)
    database_recreate(dbname)
    log_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    workers = []
    try:
        for i in range(args.workers):  # one by one: the first one migrates the system database
            log = (log_dir / f"bench-throughput{slot}-dbos-{i}.log").open("wb")
            worker = subprocess.Popen(
                [sys.executable, "-m", "bench.throughput_dbos", url, str(args.concurrency),
                 str(args.workers * args.concurrency), f"bench-{i}"],
                cwd=ROOT, env=os.environ, stdout=subprocess.PIPE, stderr=log,
                start_new_session=True)
            if worker.stdout.readline().strip() != b"ready":
                raise RuntimeError(f"a DBOS worker did not start: see {log.name}")
            workers.append(worker)
        import psycopg

        def enqueue(tenant, i):
            from dbos import DBOSClient

            name, client = tenant
            if client[0] is None:
                client[0] = DBOSClient(system_database_url=url)
            workflow_id = f"{name}-{i}-{os.urandom(6).hex()}"
            client[0].enqueue({"queue_name": QUEUE, "workflow_name": WORKFLOW,
                               "workflow_id": workflow_id}, args.steps)
            return workflow_id

        poll = psycopg.connect(server_dsn(dbname), autocommit=True)
        # warm-up: a workflow per worker slot
        tenants = [(f"t{i + 1}", [None]) for i in range(args.tenants)]
        warm, _ = posters_run(lambda tenant, i: enqueue(tenant, f"warm{i}"), tenants[:1],
                              args.workers * args.concurrency)
        while len(workflows_finished(poll)) < len(warm["t1"]):
            time.sleep(0.1)
        time.sleep(args.settle)
        pids = [w.pid for w in workers]
        tx_before, cpu_before = transactions(admin_dsn, dbname), cpu_seconds(pids)
        by_tenant, posted_at = posters_run(enqueue, tenants, args.runs)
        first = min(sent for runs in by_tenant.values() for _, sent in runs)
        total, polls = args.tenants * args.runs, 0
        deadline = time.monotonic() + args.deadline
        while True:
            finished = workflows_finished(poll)
            polls += 1
            if len(finished) - len(warm["t1"]) >= total:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"dbos: {len(finished)} of {total} workflows finished")
            time.sleep(0.2)
        cpu_used = cpu_seconds(pids) - cpu_before
        poll.close()
    finally:
        for worker in workers:
            worker.terminate()
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
    tx = settled_transactions(admin_dsn, dbname, connected=lambda: backends(admin_dsn, dbname))
    if not args.keep:
        database_drop(dbname)
    last = max(finished.values())
    times = {tenant: [finished[run] - sent for run, sent in runs]
             for tenant, runs in by_tenant.items()}
    return Measured(system="dbos", tenants=args.tenants, runs=total, steps=total * args.steps,
                    seconds=last - first, post_seconds=posted_at - first, run_seconds=times,
                    cpu_seconds=cpu_used, transactions=tx - tx_before - polls)




def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench throughput")
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--runs", type=int, default=50, help="runs per tenant")
    parser.add_argument("--steps", type=int, default=20, help="steps per run")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (DBOS: too)")
    parser.add_argument("--concurrency", type=int, default=2,
                        help="slots per worker process (DBOS: the queue's worker concurrency)")
    parser.add_argument("--in-flight", type=int, default=0,
                        help="DISPATCH_MAX_IN_FLIGHT of ours (default: all worker slots, as "
                             "docs/operators.md says to set it)")
    parser.add_argument("--systems", default="ours,dbos")
    parser.add_argument("--settle", type=float, default=11.0,
                        help="seconds idle before measuring, so idle backends report their "
                             "transactions (PostgreSQL: after 10 s)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of both systems (which goes first alternates); the round "
                             "of the median ratio is reported")
    parser.add_argument("--deadline", type=float, default=600.0)
    parser.add_argument("--port", type=int, default=0, help="API port (default by slot)")
    parser.add_argument("--keep", action="store_true", help="keep DBOS's database")
    parser.add_argument("--log-statements", action="store_true",
                        help="log every statement on our bench database (PostgreSQL's log): "
                             "to count what a run costs, not to time it")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    systems = args.systems.split(",")
    # SIGTERM (a timeout) unwinds like Ctrl-C: the workers, beat and web server are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    slot_environment("throughput")
    import django

    django.setup()
    out = sys.stdout
    with open("/proc/loadavg") as f:
        print(f"load average before: {' '.join(f.read().split()[:3])}", file=out)
    dbos_ready = "dbos" in systems
    if dbos_ready:
        try:
            import dbos as _  # noqa: F401
        except ImportError as exc:
            print(f"dbos: unavailable: {exc}; pip install -e '.[bench]'", file=out)
            dbos_ready = False
    passes = [ours_run, dbos_run] if dbos_ready else [ours_run]
    rounds: list[tuple[Measured, Measured | None]] = []
    for round_ in range(args.rounds):  # who goes first alternates: neither always follows
        measured: dict[str, Measured] = {}
        for run in passes if round_ % 2 == 0 else passes[::-1]:
            m = run(args, out)
            measured[m.system] = m
            print(m.line(), file=out, flush=True)
        rounds.append((measured["ours"], measured.get("dbos")))
    ours, dbos = median_round(rounds)
    with open("/proc/loadavg") as f:
        print(f"load average after: {' '.join(f.read().split()[:3])}", file=out)
    if len(rounds) > 1:
        print(f"median of {len(rounds)} rounds, by " + (
            "ours ÷ DBOS (each pair measured one right after the other):" if dbos
            else "our steps/s:"), file=out)
    print(closing_line(ours, dbos), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
