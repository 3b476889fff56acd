"""The `kiln` command of the Python package: every subcommand (build, run, bench, inspect, compare,
report, serve, perf) by the kiln CLI installed with it. `kiln serve` is the CLI's C++ server
(src/serve/); the Python server it replaces (kiln.serving: KServe's ModelServer) still runs for
the options only it has (--workers, --batcher, --worker-devices, --sched-batch) and as
`python -m kiln.serving`, until the C++ server has them too."""
from __future__ import annotations

import os
import sys

# Options of the Python server that the C++ `kiln serve` has not (yet): a command line with any
# of them is served by kiln.serving.
PYTHON_SERVE_OPTIONS = ("--workers", "--batcher", "--worker-devices", "--sched-batch")


def _python_serve(argv: list) -> bool:
    return any(a == o or a.startswith(o + "=") for a in argv for o in PYTHON_SERVE_OPTIONS)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "serve" and (_python_serve(argv[1:])
                                        or os.environ.get("KILN_SERVE_PYTHON") == "1"):
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
