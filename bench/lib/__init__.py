"""The modules behind bench/records.py, bench/tokens.py and bench/images.py: one a mode, and the
helpers they share (rates, timing, data makers). Import them as `lib.NAME`: the workload scripts
put bench/ on sys.path by being run from it."""
