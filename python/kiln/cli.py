"""The `kiln` command of the Python package: every subcommand (build, run, bench, inspect, compare,
report, serve, perf) is the kiln CLI installed with it, run in this process's place. `kiln serve` is
the CLI's C++ server (src/serve/)."""
from __future__ import annotations

import os
import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
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
