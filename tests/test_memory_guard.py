"""The head's memory guard (ingest/memory_guard.py): the rule on an injected clock and memory reading; the live
head's side (a raw ZMTP peer's endless multipart message) is in tests/test_adversarial.py."""

from __future__ import annotations

from ingest.memory_guard import MemoryGuard, release_free_memory, resident_bytes

MIB = 1 << 20


class Memory:
    def __init__(self, rss: int) -> None:
        self.rss = rss
        self.trims = 0

    def read(self) -> int:
        return self.rss

    def trim(self) -> None:
        self.trims += 1


def guard(mem: Memory, limit: int = 100 * MIB, margin: int = 50 * MIB) -> MemoryGuard:
    return MemoryGuard(limit, margin, every_s=0.1, quiet_s=2.0, read=mem.read, trim=mem.trim)


def test_below_the_limit_nothing_is_due_and_reads_are_paced() -> None:
    mem = Memory(90 * MIB)
    g = guard(mem)
    assert g.due(0.0) is None
    mem.rss = 200 * MIB
    assert g.due(0.05) is None  # read at most every every_s
    assert g.due(0.1) == 200 * MIB and g.sheds == 1


def test_a_shed_is_judged_after_the_quiet_period_and_freed_memory_keeps_the_limit() -> None:
    mem = Memory(150 * MIB)
    g = guard(mem)
    assert g.due(0.0) == 150 * MIB
    assert g.due(1.0) is None  # quiet_s after a shed: the closed connections are still being freed
    mem.rss = 170 * MIB  # ... but memory grows past where the shed happened: another peer, shed at once
    assert g.due(1.1) == 170 * MIB and g.sheds == 2
    mem.rss = 95 * MIB  # the unfinished messages went with their connections
    assert g.due(3.1) is None and mem.trims == 1 and g.limit == 100 * MIB and g.raises == 0
    mem.rss = 160 * MIB  # the next peer: shed again, at the same limit
    assert g.due(3.2) == 160 * MIB and g.sheds == 3


def test_a_shed_that_frees_nothing_raises_the_limit_once_instead_of_looping() -> None:
    mem = Memory(150 * MIB)
    g = guard(mem)
    assert g.due(0.0) == 150 * MIB
    mem.rss = 148 * MIB  # the head itself grew: closing connections gave back less than a quarter of the excess
    assert g.due(2.0) is None and g.raises == 1 and g.limit == 148 * MIB + 50 * MIB
    assert g.due(2.1) is None and g.sheds == 1
    mem.rss = 197 * MIB
    assert g.due(2.2) is None
    mem.rss = 230 * MIB  # a peer above the new limit is shed as before
    assert g.due(2.4) == 230 * MIB and g.sheds == 2


def test_the_heads_limit_is_its_memory_now_plus_what_it_expects_plus_the_margin() -> None:
    mem = Memory(300 * MIB)
    g = MemoryGuard.for_head(64 * MIB, 700 * MIB, read=mem.read)
    assert g is not None and g.limit == 1064 * MIB and g.margin == 64 * MIB
    assert MemoryGuard.for_head(0, 700 * MIB, read=mem.read) is None  # transport.memory_margin_mb=0: off
    assert MemoryGuard.for_head(64 * MIB, 0, read=lambda: 0) is None  # no reading on this OS: off


def test_this_process_memory_is_read_and_trimmed() -> None:
    before = resident_bytes()
    block = bytearray(64 * MIB)  # touched: resident
    assert resident_bytes() >= before + 32 * MIB
    del block
    release_free_memory()  # must not raise, glibc or not
