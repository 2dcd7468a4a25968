"""An engine's batches put back in sequence, whatever the wire did to them: every batch delivered once, in
order, or declared lost and counted; nothing declared lost that the replay socket still had; a restart
told from a duplicate and a late batch.  The publisher and its replay buffer are simulated here; the
real ones are tests/test_live_vllm.py's."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.oracle.events.sequence import Ask, Deliver, Note, Reset, Sequencer


@dataclass
class Run:
    """What the sequencer answered over one simulated run."""

    delivered: list[tuple[int, int, bytes]] = field(default_factory=list)  # (epoch, seq, payload)
    resets: list[bool] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)


def payload(epoch: int, seq: int) -> bytes:
    return f"{epoch}:{seq}".encode()


def simulate(published: list[int], arrivals: list[tuple[int, int]], buffer: int | None, replay: bool,
             join_late: int = 0, delay: int = 0) -> tuple[Run, Sequencer]:
    """``arrivals``: (epoch, seq) in the order the wire delivers them; ``published[e]`` batches per epoch.
    A replay asked is answered from the last ``buffer`` batches the epoch has published so far (with
    those ahead of the hole), ``delay`` live arrivals later: the answer and the live stream race."""
    seq = Sequencer(replay, reorder=4)
    run = Run()
    out_of: dict[int, int] = {}  # per epoch: how many batches it had published when each arrival came
    record = 0
    pending: list[tuple[int, int, bool]] = [(e, s, False) for e, s in arrivals]
    while pending:
        epoch, s, replayed = pending.pop(0)
        record += 1
        if s < 0:
            actions = seq.replay_ended(record)
        else:
            out_of[epoch] = max(out_of.get(epoch, 0), s + 1)
            actions = seq.arrive(record, s, payload(epoch, s), replayed=replayed)
        while actions:
            action = actions.pop(0)
            if isinstance(action, Deliver):
                run.delivered.append((epoch_of(action.payload), action.seq, action.payload))
            elif isinstance(action, Reset):
                run.resets.append(action.known_empty)
            elif isinstance(action, Note):
                run.notes.append(action)
            elif isinstance(action, Ask):
                top = out_of[epoch] + delay  # the publisher goes on while the request travels
                low = 0 if buffer is None else max(0, top - buffer)
                answer = [(epoch, r, True) for r in range(max(action.start, low, join_late if epoch == 0
                                                                 else 0), top)] + [(epoch, -1, True)]
                pending[delay:delay] = answer
    record += 1
    for action in seq.gave_up(record):
        if isinstance(action, Deliver):
            run.delivered.append((epoch_of(action.payload), action.seq, action.payload))
        elif isinstance(action, Note):
            run.notes.append(action)
    return run, seq


def epoch_of(data: bytes) -> int:
    return int(data.split(b":")[0])


faults = st.tuples(st.integers(20, 60), st.sets(st.integers(0, 59), max_size=8),
                   st.sets(st.integers(0, 59), max_size=5), st.sets(st.integers(0, 58), max_size=5))


def wire(n: int, drops: set[int], dups: set[int], swaps: set[int], epoch: int = 0) -> list[tuple[int, int]]:
    order = [s for s in range(n) if s not in drops]
    for i in sorted(swaps):
        if i + 1 < len(order):
            order[i], order[i + 1] = order[i + 1], order[i]
    out = []
    for s in order:
        out.append((epoch, s))
        if s in dups:
            out.append((epoch, s))
    return out


def check_epoch(run: Run, epoch: int) -> list[int]:
    got = [s for e, s, p in run.delivered if e == epoch]
    assert got == sorted(set(got)), "delivered out of order or twice"
    assert all(p == payload(e, s) for e, s, p in run.delivered)
    return got


@settings(max_examples=150)
@given(faults, st.sampled_from([None, 1000]), st.integers(0, 6))
def test_with_a_whole_replay_buffer_nothing_is_lost(f: tuple[int, set[int], set[int], set[int]],
                                                   buffer: int | None, delay: int) -> None:
    n, drops, dups, swaps = f
    drops = {d for d in drops if d < n - 1}  # the last batch arrives: every hole has a batch after it
    run, seqr = simulate([n], wire(n, drops, dups, swaps), buffer, replay=True, delay=delay)
    got = check_epoch(run, 0)
    assert got == list(range(n))
    assert seqr.stats.lost == 0 and not [x for x in run.notes if x.kind in ("gap", "restart", "joined")]


@settings(max_examples=150)
@given(faults, st.integers(2, 6), st.integers(0, 3))  # vLLM buffers at least the batch before the hole
def test_what_the_buffer_no_longer_holds_is_lost_and_counted(f: tuple[int, set[int], set[int], set[int]],
                                                             buffer: int, delay: int) -> None:
    n, drops, dups, swaps = f
    drops = {d for d in drops if d < n - 1}
    run, seqr = simulate([n], wire(n, drops, dups, swaps), buffer + delay, replay=True, delay=delay)
    got = check_epoch(run, 0)
    assert len(got) + seqr.stats.lost == n  # every batch: delivered, or declared lost
    late = {x.seq for x in run.notes if x.kind == "late"}
    assert set(range(n)) - set(got) <= drops | late  # a reordered batch the buffer no longer had: late
    losses = [x for x in run.notes if x.kind in ("gap", "joined")]
    assert sum(x.lost for x in losses) == seqr.stats.lost
    assert run.resets.count(False) == len(losses)
    assert not [x for x in run.notes if x.kind == "restart"]


@settings(max_examples=150)
@given(faults)
def test_without_a_replay_socket_only_drops_are_lost(f: tuple[int, set[int], set[int], set[int]]) -> None:
    n, drops, dups, swaps = f
    drops = {d for d in drops if d < n - 1}
    run, seqr = simulate([n], wire(n, drops, dups, swaps), None, replay=False)
    got = check_epoch(run, 0)
    assert set(range(n)) - set(got) == drops and seqr.stats.lost == len(drops)
    assert seqr.stats.late == 0 and not [x for x in run.notes if x.kind == "restart"]


@settings(max_examples=100)
@given(faults, faults, st.booleans())
def test_an_engine_that_restarts_is_read_again_from_its_first_batch(
        f1: tuple[int, set[int], set[int], set[int]], f2: tuple[int, set[int], set[int], set[int]],
        replay: bool) -> None:
    (n1, d1, u1, s1), (n2, _, u2, s2) = f1, f2
    first = wire(n1, {d for d in d1 if d < n1 - 1}, u1, s1, epoch=0)
    second = wire(n2, set(), u2, s2, epoch=1)
    run, _ = simulate([n1, n2], first + second, None, replay=replay)
    assert [x.kind for x in run.notes].count("restart") == 1
    assert [s for e, s, _ in run.delivered if e == 1] == list(range(n2))
    assert run.resets[-1] is True  # the new engine is read from an empty index


def test_joining_late_asks_from_the_first_batch() -> None:
    arrivals = [(0, s) for s in range(5, 12)]
    run, _ = simulate([12], arrivals, None, replay=True)
    assert [s for _, s, _ in run.delivered] == list(range(12)) and run.resets == [True]
    run, _ = simulate([12], arrivals, None, replay=True, join_late=3)  # the buffer begins at 3
    assert [s for _, s, _ in run.delivered] == list(range(3, 12)) and run.resets == [False]
    assert [(x.kind, x.lost) for x in run.notes] == [("joined", 3)]
    run, _ = simulate([12], arrivals, None, replay=False)
    assert [(x.kind, x.lost) for x in run.notes] == [("joined", 5)] and run.resets == [False]


def test_a_batch_after_its_gap_was_declared_is_late_not_a_restart() -> None:
    seqr = Sequencer(replay=False, reorder=2)
    actions = []
    for r, s in enumerate([0, 2, 3, 4, 1], start=1):
        actions += seqr.arrive(r, s, payload(0, s))
    kinds = [a.kind for a in actions if isinstance(a, Note)]
    assert kinds == ["gap", "late"] and seqr.stats.restarts == 0


def test_state_is_bounded() -> None:
    seqr = Sequencer(replay=True, hold=50, window=30)
    seqr.arrive(1, 0, b"x")
    for s in range(2, 400):  # batch 1 never comes, and the replay socket never answers
        seqr.arrive(s, s, payload(0, s))
        assert len(seqr.held) <= 51 and len(seqr.recent) <= 30
    assert seqr.stats.lost == 1


def test_two_publishers_on_one_topic_are_named_not_merged() -> None:
    """Two engines sending on one topic and rank to a bound endpoint interleave their sequences: each
    step back is a restart, whose message says it may be another publisher; no batch is delivered twice."""
    seqr = Sequencer(replay=False)
    notes, delivered = [], []
    for record, (who, s) in enumerate([(w, s) for s in range(6) for w in "ab"], start=1):
        for action in seqr.arrive(record, s, f"{who}{s}".encode()):
            if isinstance(action, Note):
                notes.append(action)
            elif isinstance(action, Deliver):
                delivered.append(action.payload)
    assert notes and all(n.kind == "restart" for n in notes)
    assert any("another publisher" in n.message for n in notes if n.seq)
    assert len(delivered) == len(set(delivered))


def test_a_long_hole_filled_a_part_per_answer_loses_nothing() -> None:
    # vLLM 0.31's replay ROUTER drops what exceeds its high-water mark: a slow reader gets each answer's
    # first part only. Every answer that brings some of the hole earns the rest a fresh set of asks.
    seqr = Sequencer(replay=True)
    seqr.arrive(1, 0, payload(0, 0))
    asks = [a for s in range(101, 111) for a in seqr.arrive(s, s, payload(0, s)) if isinstance(a, Ask)]
    record, answers = 200, 0
    while asks:
        start = asks.pop().start
        answers += 1
        for s in range(start, min(start + 10, 101)):  # the first 10 of the answer, then the rest dropped
            record += 1
            seqr.arrive(record, s, payload(0, s), replayed=True)
        asks += [a for a in seqr.replay_ended(record + 1) if isinstance(a, Ask)]
    assert answers == 10 and seqr.stats.lost == 0 and seqr.last == 110
