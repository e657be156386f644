"""The ``pinfeed`` command as the package's console script.

It is the same command as the Rust binary, run in this process by ``_pinfeed.cli_main`` with
the GIL released. Python ignores SIGPIPE, so a closed standard output reaches the command as
EPIPE, which it treats as the end of its output (exit 0).
"""

import signal
import sys

from pinfeed import _pinfeed


def main() -> None:
    """Run ``pinfeed`` with this process's arguments and exit with its status."""
    # The command runs in Rust without the GIL, where no KeyboardInterrupt can be raised: let
    # Ctrl-C end the process as it ends the binary.
    if hasattr(signal, "SIGINT"):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        status = _pinfeed.cli_main(["pinfeed", *sys.argv[1:]])
    except KeyboardInterrupt:
        status = 130
    sys.exit(status)


if __name__ == "__main__":
    main()
