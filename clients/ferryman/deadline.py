"""A caller's deadline, passed down to every blocking call made on its behalf.

An admin call's gRPC deadline becomes one (`ferryman.rpc.call_deadline`); each Kafka call made for it gets its
own timeout or what is left of the deadline, whichever is less, so a server whose cluster is down answers
UNAVAILABLE, saying why, before its caller gives up, and never goes on with work the caller has given up on.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ferryman.errors import KafkaOperationError


@dataclass(frozen=True)
class Deadline:
    """When the caller stops waiting, in ``time.monotonic()`` seconds (``math.inf``: never)."""

    at: float

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        """The deadline seconds from now (None: never)."""
        return cls(math.inf if seconds is None else time.monotonic() + seconds)

    def cap(self, timeout_s: float) -> float:
        """timeout_s, or what is left of the deadline when that is less (0 once it passed)."""
        return max(0.0, min(timeout_s, self.at - time.monotonic()))

    def budget(self, timeout_s: float, what: str) -> float:
        """The timeout of one Kafka call doing what: timeout_s, or what is left of the deadline when that is less.

        Raises:
            KafkaOperationError: the deadline has passed (UNAVAILABLE to an admin caller, naming what).
        """
        left_s = self.cap(timeout_s)
        if left_s <= 0:
            raise KafkaOperationError(what, TimeoutError("no answer within the call's deadline"))
        return left_s


#: No deadline: each call gets its own timeout.
NO_DEADLINE = Deadline(math.inf)
