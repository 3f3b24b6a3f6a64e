"""`python -m bench NAME [ARGS]` runs `bench.NAME.main(ARGS)`."""

import importlib
import sys


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("usage: python -m bench NAME [ARGS]  (e.g. python -m bench sandbox)", file=sys.stderr)
        return 2
    module = importlib.import_module(f"bench.{argv[0]}")
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
