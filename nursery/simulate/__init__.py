"""The scheduling-policy research kit: ``python -m nursery simulate`` (see docs/research.md).

Replays the server's real, pure scheduling policies (``nursery/scheduling``) on a virtual
clock: arrivals (:mod:`.arrivals`), a cost model of the backend (:mod:`.cost`), the event loop
that calls the policy exactly as the scheduler actor does (:mod:`.engine`), and the figures
(:mod:`.report`). No trio, no threads: a run is deterministic for a seed.
"""
