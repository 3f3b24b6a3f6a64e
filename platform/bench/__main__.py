"""`python -m bench NAME [options]`: run one benchmark against its own database."""

import importlib
import os
import sys

BENCHMARKS = {
    "checkpoints": "bench.checkpoints",
    "recovery": "bench.recovery",
    "fairness": "bench.fairness",
    "retention": "bench.retention",
    "sandbox": "bench.sandbox",
    "resume": "bench.resume",
    "chaos": "bench.chaos",
    "langgraph": "bench.langgraph",
    "partition": "bench.partition",
    "throughput": "bench.throughput",
    "tenants": "bench.tenants",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: python -m bench {{{','.join(BENCHMARKS)}}} [options]  (NAME --help for more)",
              file=sys.stderr)
        return 2
    # Before the module is imported: importing the project (agentplatform.celery) would
    # default it to the development settings, and their database.
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    module = importlib.import_module(BENCHMARKS[argv[0]])
    if not getattr(module, "OWN_DJANGO_SETUP", False):  # else it picks its own database
        import django

        django.setup()
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
