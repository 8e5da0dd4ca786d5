"""An admin call's deadline (`ferryman.deadline`, `ferryman.rpc.call_deadline`): what each Kafka call gets,
and what the servicer keeps back to answer."""

from __future__ import annotations

import math
import time

import pytest
from ferryman.deadline import Deadline
from ferryman.errors import KafkaOperationError
from ferryman.rpc import ANSWER_MARGIN_S, call_deadline


class _Context:
    """The one method of grpc.ServicerContext that call_deadline reads."""

    def __init__(self, remaining: float | None) -> None:
        self._remaining = remaining

    def time_remaining(self) -> float | None:
        return self._remaining


def test_a_call_gets_the_stores_own_timeout_or_what_is_left_when_that_is_less() -> None:
    assert Deadline.after(None).cap(30.0) == 30.0
    assert 4.0 < Deadline.after(5.0).cap(30.0) <= 5.0
    assert Deadline.after(60.0).cap(30.0) == 30.0
    assert Deadline(time.monotonic() - 1).cap(30.0) == 0.0  # passed: nothing left, never negative


def test_a_call_started_after_the_deadline_is_refused_as_the_cluster_not_answering_naming_the_step() -> None:
    assert Deadline.after(None).budget(30.0, "reading the audit topic t") == 30.0
    with pytest.raises(KafkaOperationError, match=r"reading the audit topic t.*no answer within the call's deadline"):
        Deadline(time.monotonic() - 1).budget(30.0, "reading the audit topic t")


@pytest.mark.parametrize(
    ("remaining", "budget"),
    [
        (None, math.inf),  # a caller with no deadline: the store's own timeouts only
        (30.0, 30.0 - ANSWER_MARGIN_S),
        (0.5, 0.45),  # a short deadline keeps a tenth back, not the whole margin
    ],
)
def test_the_servicer_keeps_back_time_to_answer_before_the_callers_deadline(
    remaining: float | None, budget: float
) -> None:
    deadline = call_deadline(_Context(remaining))  # type: ignore[arg-type]
    left = deadline.at - time.monotonic()
    assert left == budget if math.isinf(budget) else budget - 0.5 < left <= budget
