"""A server's deadline for the work of one call: the caller's gRPC deadline, less the time to answer."""

from __future__ import annotations

import grpc

from ferryman.deadline import NO_DEADLINE, Deadline

#: Time kept back from the caller's deadline for the answer to reach it: a server whose cluster is down
#: answers UNAVAILABLE, naming what it waited for, rather than the caller meeting its own DEADLINE_EXCEEDED.
ANSWER_MARGIN_S = 1.0


def call_deadline(context: grpc.ServicerContext) -> Deadline:
    """The deadline of this call's work: the caller's, less the time to answer (a tenth of what is left at most)."""
    remaining = context.time_remaining()
    if remaining is None:
        return NO_DEADLINE
    return Deadline.after(remaining - min(ANSWER_MARGIN_S, remaining / 10))
