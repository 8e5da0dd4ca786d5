"""Model check of the exactly-once argument, with the real pure parts wired together.

One source partition with sparse offsets (markers, aborted transactions,
compaction) is replicated by simulated wrapper processes that use the real
``build_envelopes`` and ``ProgressTracker`` the way ``_datapath.py`` and ``_clients.py`` do, onto
a simulated staging partition (an append-only log), read by a simulated
deduper that uses the real ``envelope.decode`` and ``decide``. Faults, chosen
by ``random.Random(seed)``:

- a produce is lost (the delivery report fails) while later envelopes of the
  same epoch still land in the log: the deduper sees a gap before the rewind's
  resend arrives;
- a produce lands in the log although its report says it failed (ambiguous
  delivery): the rewind sends it again;
- the wrapper crashes (unserved reports are lost) and a new one resumes from
  the last committed offset, from a random earlier committed offset (offsets
  reset), from the deduper's watermark (commit expired) or from the beginning;
  the old process may live on for a while as a zombie that keeps producing;
- the deduper crashes and rolls back to its last transaction (state, output
  and staging position together) and reads staging again;
- the deduper asks for a gap's records over the control link (a resend built
  like ``_control.py`` does: chained to ``from_offset - 1``).

The destination must hold every source record exactly once, in order,
byte-for-byte; after every decision it must hold exactly the source records up
to the watermark. Mutants of ``decide`` check that the model can fail.
"""

from __future__ import annotations

import bisect
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import pytest
from confluent_kafka import OFFSET_BEGINNING
from ferryman import envelope
from ferryman.state import PartitionKey
from ferryman.v1 import envelope_pb2
from ferryman_deduper._decide import Decision, PartitionState, Verdict, decide
from ferryman_wrapper._envelopes import build_envelopes
from ferryman_wrapper._progress import ProgressTracker

from tests.unit._fakes import FakeMessage, Seen, as_messages, random_messages, sparse_offsets

KEY = PartitionKey("orders", 3)
TOPIC_ID = b"\x5e" * 16
SOURCE = envelope_pb2.SourcePartition(cluster_id="src", topic="orders", topic_id=TOPIC_ID, partition=3)

DecideFn = Callable[[PartitionState | None, bytes, int, Sequence[int]], Decision]


class ModelViolationError(AssertionError):
    """The destination stopped being an exact prefix of the source."""


@dataclass(frozen=True)
class Faults:
    """Probabilities per step (or per envelope, for the produce outcomes)."""

    lost: float = 0.0
    ambiguous: float = 0.0
    wrapper_crash: float = 0.0
    zombie: float = 0.0
    deduper_crash: float = 0.0
    resend: float = 0.0


NO_FAULTS = Faults()


@dataclass
class Report:
    """A delivery report the wrapper has not served yet."""

    last_offset: int
    epoch: int
    ok: bool


@dataclass
class Group:
    """The wrapper's consumer group on the source cluster: committed offsets."""

    committed: int | None = None
    history: list[int] = field(default_factory=list)

    def commit(self, next_offset: int) -> None:
        self.committed = next_offset
        self.history.append(next_offset)


class Wrapper:
    """One wrapper process owning the source partition."""

    def __init__(self, name: str, source: list[FakeMessage], staging: list[bytes], resume_at: int | None) -> None:
        self.name = name
        self.source = source
        self.offsets = [m.offset() for m in source]
        self.staging = staging
        self.tracker = ProgressTracker()
        self.reports: deque[Report] = deque()
        self.epoch = 0
        self.chain = -1
        self.pos = 0
        if resume_at is None:
            self._restart(0, OFFSET_BEGINNING)  # new to the flow: start_position earliest
        else:
            self._restart(resume_at, None)

    def _restart(self, next_offset: int, logical: int | None) -> None:
        # As SourcePartitions.restart followed by the consumer's seek.
        self.epoch += 1
        self.chain = next_offset - 1 if logical is None else -1
        self.tracker.start(KEY, next_offset, logical)
        self.pos = 0 if logical is not None else bisect.bisect_left(self.offsets, next_offset)

    @property
    def done(self) -> bool:
        return self.pos == len(self.source) and not self.reports and not self.tracker.any_failed

    def send(self, rng: random.Random, faults: Faults) -> None:
        """Consume a batch and produce it as envelopes (as DataPath._send_run)."""
        run = self.source[self.pos : self.pos + rng.randint(1, 10)]
        for built in build_envelopes(
            as_messages(run),
            SOURCE,
            self.chain,
            wrapper_id=self.name,
            wrapper_epoch=self.epoch,
            max_records=rng.randint(1, 12),
            max_bytes=rng.choice([1, 400, 4096, 1 << 20]),
        ):
            r = rng.random()
            if r < faults.lost:
                ok = False  # not in the log; later envelopes may still be
            elif r < faults.lost + faults.ambiguous:
                ok = False
                self.staging.append(built.value)
            else:
                ok = True
                self.staging.append(built.value)
            self.reports.append(Report(built.last_offset, self.epoch, ok))
            self.tracker.sent(KEY, built.last_offset)
            self.chain = built.last_offset
        self.pos += len(run)

    def serve_reports(self, n: int | None = None) -> None:
        """producer.poll(): delivery reports, in send order, stale epochs ignored."""
        for _ in range(len(self.reports) if n is None else min(n, len(self.reports))):
            report = self.reports.popleft()
            if report.epoch != self.epoch:
                continue
            if report.ok:
                self.tracker.acked(KEY, report.last_offset)
            else:
                self.tracker.failed(KEY)

    def commit(self, group: Group) -> None:
        positions = self.tracker.commit_positions()
        if positions:
            group.commit(positions[KEY])
            self.tracker.mark_committed(positions)

    def rewind_if_failed(self, group: Group) -> None:
        """As LoopClients.rewind: flush, commit the acknowledged prefix, resume after it."""
        if not self.tracker.any_failed:
            return
        self.serve_reports()
        self.commit(group)
        ((next_offset, logical),) = self.tracker.rewind_positions().values()
        self._restart(next_offset, logical)


class Deduper:
    """The deduper of the staging partition: decisions applied transactionally."""

    def __init__(self, source: list[FakeMessage], staging: list[bytes], decide_fn: DecideFn) -> None:
        self.expected = [Seen.of_message(m) for m in source]
        self.offsets = [m.offset() for m in source]
        self.source = source
        self.staging = staging
        self.decide_fn = decide_fn
        self.state: PartitionState | None = None
        self.written: list[Seen] = []
        self.pos = 0
        self.gap: tuple[int, int] | None = None
        self._txn: tuple[PartitionState | None, int, int] = (None, 0, 0)

    @property
    def watermark(self) -> int:
        return -1 if self.state is None else self.state.watermark

    @property
    def committed_watermark(self) -> int:
        """What the state topic says: the watermark of the last committed transaction."""
        state = self._txn[0]
        return -1 if state is None else state.watermark

    def consume(self, n: int) -> None:
        for _ in range(n):
            if self.pos >= len(self.staging):
                return
            self.apply(envelope.decode(self.staging[self.pos]))
            self.pos += 1

    def apply(self, env: envelope.DecodedEnvelope) -> None:
        before = self.watermark
        d = self.decide_fn(self.state, env.source.topic_id, env.previous_offset, env.run.offsets)
        if d.verdict is Verdict.ACCEPT:
            assert d.new_state is not None
            self.written.extend(Seen.of_run(env.run)[d.start :])
            self.state = d.new_state
            if self.gap is not None and self.watermark >= self.gap[0]:
                self.gap = None
        elif d.verdict is Verdict.GAP:
            self.gap = (d.missing_from, max(d.missing_to, env.last_offset))
        elif d.verdict is not Verdict.DUPLICATE:
            raise ModelViolationError(f"unexpected verdict {d.verdict} for one incarnation of the topic")
        self._check(before)

    def _check(self, before: int) -> None:
        # By induction written == expected[: upto(before)]; check what this decision added.
        lo = bisect.bisect_right(self.offsets, before)
        hi = bisect.bisect_right(self.offsets, self.watermark)
        if self.watermark < before:
            raise ModelViolationError(f"watermark went back from {before} to {self.watermark}")
        if len(self.written) != hi or self.written[lo:] != self.expected[lo:hi]:
            got = [s.offset for s in self.written[lo:]]
            want = self.offsets[lo:hi]
            raise ModelViolationError(
                f"after watermark {before}: wrote {got}, the source has {want} up to {self.watermark}"
            )

    def resend(self) -> None:
        """Ask the wrapper for the gap's records over the control link (as _control.py serves it)."""
        if self.gap is None:
            return
        from_offset, to_offset = self.gap
        msgs = [m for m in self.source if from_offset <= m.offset() <= to_offset]
        for built in build_envelopes(
            as_messages(msgs),
            SOURCE,
            from_offset - 1,
            wrapper_id="resend",
            wrapper_epoch=0,
            max_records=5,
            max_bytes=4096,
        ):
            self.apply(envelope.decode(built.value))

    def commit(self) -> None:
        self._txn = (self.state, len(self.written), self.pos)

    def crash(self) -> None:
        self.state, n, self.pos = self._txn
        del self.written[n:]
        self.gap = None


def simulate(seed: int, faults: Faults, decide_fn: DecideFn = decide) -> tuple[list[Seen], list[Seen]]:
    """Run one replication with faults, then without; return (written, expected)."""
    rng = random.Random(seed)
    source = random_messages(rng, sparse_offsets(rng, rng.randint(1, 250)), max_len=rng.choice([4, 40, 200]))
    staging: list[bytes] = []
    group = Group()
    wrapper = Wrapper("w1", source, staging, resume_at=None)
    zombies: list[tuple[Wrapper, int]] = []
    deduper = Deduper(source, staging, decide_fn)
    generation = 1

    def step(f: Faults) -> None:
        nonlocal wrapper, generation, zombies
        r = rng.random()
        if r < 0.35:
            wrapper.send(rng, f)
        elif r < 0.55:
            wrapper.serve_reports(rng.randint(1, 4))
        elif r < 0.65:
            wrapper.commit(group)
        else:
            deduper.consume(rng.randint(1, 6))
        wrapper.rewind_if_failed(group)
        if rng.random() < 0.2:
            deduper.commit()
        if rng.random() < f.deduper_crash:
            deduper.crash()
        if rng.random() < f.resend:
            deduper.resend()
        for z, _ in zombies:
            if rng.random() < 0.3:
                z.send(rng, f)
        zombies = [(z, left - 1) for z, left in zombies if left > 1]
        if rng.random() < f.wrapper_crash:
            if rng.random() < f.zombie:
                zombies.append((wrapper, rng.randint(1, 8)))
            choice = rng.random()
            if choice < 0.6 or not group.history:
                resume_at = group.committed
            elif choice < 0.8:
                resume_at = rng.choice(group.history)
            elif choice < 0.9:
                resume_at = deduper.committed_watermark + 1 if deduper.committed_watermark >= 0 else None
            else:
                resume_at = None
            generation += 1
            wrapper = Wrapper(f"w{generation}", source, staging, resume_at)

    for _ in range(rng.randint(20, 300)):
        step(faults)
    # No more faults: everything must arrive, exactly once.
    zombies = []
    for _ in range(200):
        if wrapper.done and deduper.pos == len(staging) and deduper.gap is None:
            break
        if wrapper.pos < len(source):
            wrapper.send(rng, NO_FAULTS)
        wrapper.serve_reports()
        wrapper.commit(group)
        wrapper.rewind_if_failed(group)
        deduper.consume(len(staging))
        deduper.resend()
    else:
        raise ModelViolationError(f"no progress: watermark {deduper.watermark}, source ends at {source[-1].offset()}")
    return deduper.written, deduper.expected


ALL_FAULTS = Faults(lost=0.08, ambiguous=0.05, wrapper_crash=0.04, zombie=0.5, deduper_crash=0.03, resend=0.1)

SCENARIOS = {
    "no-faults": NO_FAULTS,
    "lost-sends": Faults(lost=0.15),
    "ambiguous-sends": Faults(ambiguous=0.2),
    "lost-without-resend": Faults(lost=0.1, ambiguous=0.05),
    "wrapper-crashes": Faults(wrapper_crash=0.08),
    "zombies": Faults(lost=0.05, wrapper_crash=0.08, zombie=1.0),
    "deduper-crashes": Faults(lost=0.05, deduper_crash=0.08, resend=0.2),
    "everything": ALL_FAULTS,
}
SEEDS_PER_CASE = 30


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_source_record_arrives_exactly_once_in_order(scenario: str) -> None:
    for seed in range(SEEDS_PER_CASE):
        written, expected = simulate(seed, SCENARIOS[scenario])
        assert written == expected, f"seed {seed}"


@pytest.mark.parametrize("first_seed", range(1000, 1240, 60))
def test_exactly_once_under_every_fault_at_once(first_seed: int) -> None:
    for seed in range(first_seed, first_seed + 60):
        written, expected = simulate(seed, ALL_FAULTS)
        assert written == expected, f"seed {seed}"


def test_the_model_really_produces_gaps_duplicates_and_replays() -> None:
    """The fault scenarios reach the verdicts they are meant to exercise."""
    seen: dict[Verdict, int] = dict.fromkeys(Verdict, 0)
    partial = 0

    def counting(
        state: PartitionState | None, topic_id: bytes, previous_offset: int, offsets: Sequence[int]
    ) -> Decision:
        nonlocal partial
        d = decide(state, topic_id, previous_offset, offsets)
        seen[d.verdict] += 1
        partial += d.verdict is Verdict.ACCEPT and d.start > 0
        return d

    for seed in range(40):
        simulate(seed, ALL_FAULTS, counting)
    assert seen[Verdict.ACCEPT] > 100
    assert seen[Verdict.DUPLICATE] > 100
    assert seen[Verdict.GAP] > 20
    assert partial > 20


# ---------------------------------------------------------------- the model has teeth


def _ignores_gaps(
    state: PartitionState | None, topic_id: bytes, previous_offset: int, offsets: Sequence[int]
) -> Decision:
    d = decide(state, topic_id, previous_offset, offsets)
    if d.verdict is Verdict.GAP:
        return Decision(Verdict.ACCEPT, 0, PartitionState(offsets[-1], topic_id))
    return d


def _rewrites_the_watermark_record(
    state: PartitionState | None, topic_id: bytes, previous_offset: int, offsets: Sequence[int]
) -> Decision:
    d = decide(state, topic_id, previous_offset, offsets)
    if d.verdict is Verdict.ACCEPT and d.start > 0:
        return replace(d, start=d.start - 1)
    return d


def _links_by_offset_minus_one(
    state: PartitionState | None, topic_id: bytes, previous_offset: int, offsets: Sequence[int]
) -> Decision:
    # The classic mistake: treating any hole in the offsets as missing records.
    return decide(state, topic_id, offsets[0] - 1, offsets)


@pytest.mark.parametrize("mutant", [_ignores_gaps, _rewrites_the_watermark_record, _links_by_offset_minus_one])
def test_a_wrong_decision_is_caught_by_the_model(mutant: DecideFn) -> None:
    for seed in range(200):
        try:
            written, expected = simulate(seed, ALL_FAULTS, mutant)
        except ModelViolationError:
            return
        if written != expected:
            return
    pytest.fail(f"{mutant.__name__} survived 200 seeds: the model is too weak")
