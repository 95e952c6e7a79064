"""A session's webhook in the core (SPEC §10): set, replaced, taken away, handed to a store.

And ``record(..., handled=True)``: a webhook's firing is handled whatever its
handler is named, so its result is the body.
"""

from __future__ import annotations

import pytest

from session.delta import Webhook
from session.errors import BadHandler, BadKey
from session.ops import GetWebhook, Record, SetWebhook
from session.session import Session

TS = "2026-12-01T00:00:00.000Z"


def test_a_webhook_is_set_replaced_and_taken_away_and_the_delta_says_so() -> None:
    s = Session("s")
    s.take_delta()
    assert GetWebhook().run(s, None) is None
    SetWebhook(Webhook("hunter2")).run(s, None)
    assert s.webhook == Webhook("hunter2", "on-webhook")
    delta = s.take_delta()
    assert delta.webhook_changed and delta.webhook == Webhook("hunter2")
    assert not s.take_delta().webhook_changed  # nothing since
    s.set_webhook(Webhook("other", "on-github"))
    s.set_webhook(None)
    delta = s.take_delta()
    assert delta.webhook_changed and delta.webhook is None
    assert Session.restore(s.snapshot()).webhook is None


def test_a_snapshot_brings_the_webhook_back_and_a_reset_delta_carries_it() -> None:
    s = Session("s")
    s.set_webhook(Webhook("k", "on-ci"))
    back = Session.restore(s.snapshot())
    assert back.webhook == Webhook("k", "on-ci")
    back.mark_reset()
    delta = back.take_delta()
    assert delta.reset and delta.webhook_changed and delta.webhook == Webhook("k", "on-ci")


@pytest.mark.parametrize(
    ("hook", "error"),
    [(Webhook(""), BadKey), (Webhook("x" * 257), BadKey), (Webhook("k", "a b"), BadHandler)],
)
def test_a_bad_webhook_is_refused_and_changes_nothing(
    hook: Webhook, error: type[Exception]
) -> None:
    s = Session("s")
    before = s.changes
    with pytest.raises(error):
        SetWebhook(hook).check()
    with pytest.raises(error):
        s.set_webhook(hook)
    assert s.webhook is None and s.changes == before


def test_a_handled_record_keeps_the_text_as_its_result_whatever_the_handler() -> None:
    s = Session("s")
    Record("on-github", '{"ref": "main"}', TS, key="d-1", handled=True).run(s, None)
    Record("on-github", "raw", TS).run(s, None)
    first, second = s.ring.firings()
    assert (first.result, first.event) == ('{"ref": "main"}', None)
    assert (second.result, second.event) == (None, "raw")
    again = Record("on-github", "redelivered", TS, key="d-1", handled=True).run(s, None)
    assert again.duplicate and again.seq == 1
