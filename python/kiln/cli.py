"""The `kiln` command of the Python package: `kiln serve` (kiln.serving) here, every other
subcommand (build, run, bench, inspect, compare, report) by the kiln CLI installed with it."""
from __future__ import annotations

import os
import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "serve":
        from kiln.serving import main as serve_main

        return serve_main(argv[1:])
    from kiln.tools import cli_path

    try:
        exe = cli_path()
    except Exception as e:  # noqa: BLE001 - one line, as the CLI prints its errors
        print(f"kiln: error: {e}", file=sys.stderr)
        return 1
    if os.path.realpath(exe) == os.path.realpath(sys.argv[0]):
        print("kiln: error: the kiln CLI is not installed with this package", file=sys.stderr)
        return 1
    os.execv(exe, [exe, *argv])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
