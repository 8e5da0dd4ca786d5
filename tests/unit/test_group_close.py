"""Whether an assignment is on its way to a group consumer (ferryman.group_close.JoinTracker)."""

from __future__ import annotations

from ferryman.group_close import JoinTracker


def test_an_assignment_is_due_after_subscribing_and_after_a_revoke_while_subscribed() -> None:
    joins = JoinTracker()
    assert not joins.due
    joins.subscribed()
    assert joins.due
    joins.assigned()
    assert not joins.due
    joins.revoked()  # a cooperative revoke, or a loss: a rejoin and an assign callback follow
    assert joins.due
    joins.assigned()
    assert not joins.due


def test_nothing_is_due_after_unsubscribing_even_when_its_revoke_comes() -> None:
    joins = JoinTracker()
    joins.subscribed()
    joins.assigned()
    joins.unsubscribed()
    assert not joins.due
    joins.revoked()  # unsubscribe's revoke: no assign follows, so a close must not wait for one
    assert not joins.due
