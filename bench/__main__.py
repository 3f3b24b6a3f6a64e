"""`python -m bench NAME [ARGS]`: run benchmark `bench.NAME.main(argv)`."""

import importlib
import sys


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("usage: python -m bench NAME [ARGS]  (e.g. retention)", file=sys.stderr)
        return 2
    module = importlib.import_module(f"bench.{argv[0]}")
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
