"""Runs one mode of a workload script: `python3 bench/WORKLOAD.py MODE [ARGS...]` runs the module
that MODE names as a script, with ARGS as its command line."""

import runpy
import sys


def dispatch(doc, modes):
    """Runs the module of the mode named by sys.argv[1] (`modes`: name -> (module, what it does)),
    or prints `doc` and the modes and exits 2 when none or an unknown one is named."""
    if len(sys.argv) < 2 or sys.argv[1] not in modes:
        print(doc.strip(), file=sys.stderr)
        print("\nmodes:", file=sys.stderr)
        for name, (_, what) in modes.items():
            print(f"  {name:<12}{what}", file=sys.stderr)
        if len(sys.argv) >= 2 and sys.argv[1] not in ("-h", "--help"):
            print(f"\nunknown mode {sys.argv[1]!r}", file=sys.stderr)
        sys.exit(2)
    mode = sys.argv[1]
    # argparse names the program after argv[0]: "records.py ab" in usage lines and errors.
    sys.argv = [f"{sys.argv[0]} {mode}", *sys.argv[2:]]
    runpy.run_module(modes[mode][0], run_name="__main__")
