"""The head's side of the collector protocol (docs/PROTOCOL.md): everything between a collector's
socket and the replay.

Registration (HELLO -> WELCOME, caps, CURVE), one data socket per collector, validation of every
message, parking behind the insert gate, fair insert into the replay, CREDIT back to the
collector, and reclaiming registrations that left or went silent. The replay (replay/) is pure
storage and never sees a socket; this package writes into it through a narrow seam.

Reading order:

1. `registration.py` -- the control socket, HELLO -> WELCOME, who may register and where each
   collector sends (its own data socket, its exploration slot).
2. `peers.py` -- what the head knows about each registered collector and the rules applied to it,
   without sockets: parking, least-recently-served order, waiting vs stalled, episode summaries.
3. `consolidation_types.py` -- the consolidation thread's seams (registrations, replay sink,
   insert gate) and its counters snapshot.
4. `consolidation.py` -- the thread itself: polls every socket, validates, parks, inserts fairly,
   sends CREDIT and reclaims.

Imports replay/ and shared/ only (tests/test_boundaries.py).
"""
