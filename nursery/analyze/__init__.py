"""``python -m nursery analyze``: a model's best configuration, found on the simulator.

Profile the real model once on a server of its own (``profiler``), search the configuration
space on the virtual clock with the server's own scheduling policies (``space``, ``search``),
verify the best few on the real server with perf_analyzer, and write the winner beside the
original ``config.pbtxt`` with a report (``report``). ``cli`` ties them together. See
docs/analyze.md.
"""
