"""What every span read yields (its Arrow schema) and how it reads: shared by ``_reader`` and ``_direct``."""

from __future__ import annotations

import pyarrow as pa

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
#: The Arrow schema of every batch; ``schema.SPARK_SCHEMA`` is the same in Spark's terms.
ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADER_TYPE),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestamp_type", pa.int32()),
    ]
)

#: Records per consume() call and so at most per Arrow batch: large enough that the
#: per-call and per-batch costs (~100 µs) vanish, small enough to keep a batch in cache.
CONSUME_BATCH = 10_000
#: Longest wait of one consume() call; the stall budget is counted across calls. consume(n, timeout)
#: returns before the timeout only once n messages are there, and the end of a span often holds fewer
#: (transaction markers, the partition's end): 0.5 s here cost every split half a second at its end,
#: a 125 k-record split read in 0.8-1.7 s instead of 0.33 s. Shorter calls cost ~100 us each.
CONSUME_WAIT_S = 0.05
