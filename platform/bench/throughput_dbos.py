"""The DBOS peer of `python -m bench throughput`: a worker process that launches DBOS with the
bench's queue and runs its workflows (one `@DBOS.step` per step) until it is terminated.

`python -m bench.throughput_dbos <system database url> <worker concurrency> <concurrency>
<executor id>` prints "ready" once launched. Nothing of the project is imported here.
"""

import signal
import sys
import threading

QUEUE = "bench_throughput"
WORKFLOW = "bench_throughput_loop"


def workflows_finished(conn) -> dict[str, float]:
    """Workflow id -> when it ended (epoch seconds), for every workflow that succeeded."""
    rows = conn.execute("SELECT workflow_uuid, updated_at / 1000.0, status "
                        "FROM dbos.workflow_status WHERE status IN ('SUCCESS', 'ERROR')").fetchall()
    failed = [row for row in rows if row[2] != "SUCCESS"]
    if failed:
        raise RuntimeError(f"dbos: {len(failed)} workflows failed, e.g. {failed[:3]}")
    return {workflow: float(ended) for workflow, ended, _ in rows}


def main(url: str, worker_concurrency: int, concurrency: int, executor: str) -> None:
    from dbos import DBOS

    @DBOS.step()
    def bench_throughput_step(n: int) -> int:
        return n + 1

    @DBOS.workflow(name=WORKFLOW)
    def bench_throughput_loop(steps: int) -> int:
        n = 0
        for _ in range(steps):
            n = bench_throughput_step(n)
        return n

    DBOS(config={"name": "agentplatform-bench-throughput", "system_database_url": url,
                 "application_version": "bench", "executor_id": executor,
                 "log_level": "WARNING"})
    DBOS.launch()
    # Polled every 0.1 s (the DBOS baseline); the same slots as our workers.
    DBOS.register_queue(QUEUE, worker_concurrency=worker_concurrency,
                        global_concurrency=concurrency, polling_interval_sec=0.1)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("ready", flush=True)
    stop.wait()
    DBOS.destroy()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
