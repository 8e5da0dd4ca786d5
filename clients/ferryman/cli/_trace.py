"""``ferryman trace TOPIC PARTITION OFFSET``: the trace of one destination record, and its link in the tracing UI."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from confluent_kafka import Consumer, KafkaException, TopicPartition

from ferryman.cli._common import (
    EXIT_FAILED,
    EXIT_FINDING,
    EXIT_OK,
    EXIT_USAGE,
    ConfigOption,
    FlowOption,
    OutputOption,
    check_output,
    fail,
    load_flow,
)
from ferryman.client_config import base_config
from ferryman.errors import ConfigError
from ferryman.tracing import TRACEPARENT, context_of

#: One fetch of one record from a reachable cluster; longer means the cluster or the offset is not there.
DEFAULT_TIMEOUT_S = 10.0


def trace(
    topic: Annotated[str, typer.Argument(help="Destination topic.", show_default=False)],
    partition: Annotated[int, typer.Argument(help="Partition of the record.", show_default=False, min=0)],
    offset: Annotated[int, typer.Argument(help="Offset of the record.", show_default=False, min=0)],
    *,
    config: ConfigOption = None,
    flow: FlowOption = None,
    output: OutputOption = "text",
    timeout_s: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the record.")] = DEFAULT_TIMEOUT_S,
) -> int:
    """Print the trace id of a destination record (its traceparent header) and its link in the tracing UI.

    Exit codes: 0 found, 1 the record carries no trace context (not sampled, or tracing was off),
    2 usage or configuration error, 3 the record could not be read.
    """
    try:
        check_output(output)
        cfg, chosen = load_flow(config, flow)
    except ConfigError as exc:
        return fail(str(exc), EXIT_USAGE)
    conf = base_config(cfg.clusters[chosen.target], "ferryman-trace")
    conf.update({"group.id": "ferryman-trace", "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer = Consumer(conf)
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        msgs = consumer.consume(num_messages=1, timeout=timeout_s)
    except KafkaException as exc:
        return fail(f"cannot read {topic}-{partition}@{offset} at cluster {chosen.target}: {exc}", EXIT_FAILED)
    finally:
        consumer.close()
    if not msgs or msgs[0].error() is not None or msgs[0].offset() != offset:
        why = msgs[0].error() if msgs and msgs[0].error() is not None else f"no record there within {timeout_s:g} s"
        return fail(f"cannot read {topic}-{partition}@{offset} at cluster {chosen.target}: {why}", EXIT_FAILED)
    ctx = context_of(msgs[0].headers() or [])
    if ctx is None:
        return fail(
            f"{topic}-{partition}@{offset} has no {TRACEPARENT} header: it was not traced (not sampled, or tracing "
            f"was off when it was replicated)",
            EXIT_FINDING,
        )
    link = cfg.tracing.ui_url_template.replace("{trace_id}", ctx.trace_id)
    if output == "json":
        print(json.dumps({"trace_id": ctx.trace_id, "traceparent": ctx.traceparent, "url": link}))
    else:
        print(f"trace id    {ctx.trace_id}\ntraceparent {ctx.traceparent}\nlink        {link}")
    return EXIT_OK
