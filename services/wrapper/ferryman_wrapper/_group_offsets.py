"""``WrapperService.GetGroupOffsets``: a consumer group's committed offsets on the source cluster.

The first half of moving a group's consumers to the destination (``ferryman offsets translate-group``): the
wrapper is the side that reaches the source; the deduper translates (``TranslateGroupOffsets``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ferryman.config import FlowConfig
from ferryman.errors import InvalidRequestError
from ferryman.group_offsets import last_records_below, read_group_offsets
from ferryman.naming import TopicFilter
from ferryman.v1 import control_pb2

#: Longest a read may take, whatever the caller's deadline: a person is waiting.
MAX_BUDGET_S = 30.0


class SourceGroupOffsets:
    """Reads a group's committed offsets of the flow's source topics; any thread."""

    def __init__(self, consumer_config: Callable[[], dict[str, Any]], flow: Callable[[], FlowConfig]) -> None:
        """Read with consumer_config's cluster (the source), for the topics flow() replicates."""
        self._consumer_config = consumer_config
        self._flow = flow

    def read(self, request: control_pb2.GetGroupOffsetsRequest, budget_s: float) -> control_pb2.GetGroupOffsetsResponse:
        """The group's committed offsets, by topic and partition.

        Raises:
            InvalidRequestError: no group named.
            KafkaOperationError: the source cluster did not answer within the budget.
        """
        if not request.group:
            raise InvalidRequestError("group", "must name a consumer group")
        deadline = time.monotonic() + min(max(budget_s, 0.1), MAX_BUDGET_S)
        chosen = TopicFilter.of(self._flow())
        offsets = read_group_offsets(
            self._consumer_config(), request.group, chosen.matches, deadline - time.monotonic()
        )
        # Offsets past transaction markers: the deduper then knows which record the group read last.
        last = last_records_below(self._consumer_config(), offsets, deadline - time.monotonic())
        return control_pb2.GetGroupOffsetsResponse(
            group=request.group,
            offsets=[
                control_pb2.GroupOffset(topic=t, partition=p, offset=o, last_record_offset=last.get((t, p)))
                for (t, p), o in sorted(offsets.items())
            ],
        )
