"""A decoded envelope's source partition does not keep the envelope's bytes alive.

The deduper keeps the source of every envelope its open transaction wrote until
the commit (offset-map slices, state). A protobuf sub-message shares its
parent's arena, so ``env.source`` held that way kept each whole parsed envelope
(its records, ~512 KB with large records) in memory: the deduper's RSS grew
with the transaction, past what its queues allow (test_memory_bound.py). The
arena is memory of upb's, not Python objects: the process's RSS shows it,
tracemalloc does not.
"""

from __future__ import annotations

from ferryman import envelope
from ferryman.envelope import RecordRun
from ferryman.v1 import envelope_pb2

from tests.helpers.procstatus import status_kib

SRC = envelope_pb2.SourcePartition(cluster_id="src-cluster", topic="orders", topic_id=bytes(range(16)), partition=7)
ENVELOPES = 100
VALUE_BYTES = 100 * 1024
RECORDS = 5  # ~512 KB per envelope, as envelope_max_bytes cuts large records


def test_the_sources_of_decoded_envelopes_do_not_hold_their_records() -> None:
    run = RecordRun(
        offsets=range(RECORDS),
        timestamps_ms=[1_800_000_000_000 + i for i in range(RECORDS)],
        timestamp_types=[0],
        keys=[b"k%d" % i for i in range(RECORDS)],
        values=[bytes([i]) * VALUE_BYTES for i in range(RECORDS)],
    )
    data = envelope.encode(SRC, -1, run, wrapper_id="w", wrapper_epoch=1)
    envelope.decode(data)  # warm: the first decode's one-off allocations are not the sources'
    before = status_kib("VmRSS")
    sources = [envelope.decode(data).source for _ in range(ENVELOPES)]
    grew = (status_kib("VmRSS") - before) / 1024
    held = ENVELOPES * len(data) / (1 << 20)
    assert all(s == SRC for s in sources)
    # Holding the sub-messages held every envelope: ~50 MiB here. Copies take a few kilobytes.
    assert grew < held / 10, f"{ENVELOPES} decoded sources hold {grew:.1f} MiB ({held:.1f} MiB of envelopes)"
