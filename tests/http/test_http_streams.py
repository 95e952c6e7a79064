"""An event stream's life is a table of moves (``repl_daemon.http.streams._MOVES``), as a
wait's is: every state has its moves, the end has none but the client's going, and a move
the table does not list raises and changes nothing."""

from __future__ import annotations

from typing import Any, cast

import pytest

from repl_daemon.http.streams import _MOVES, Follow, Streams, _State


def stream() -> Follow:
    return Follow(cast(Any, None), Streams(), None, "s", 0, None)


def test_every_state_has_its_moves_and_the_ends_have_almost_none() -> None:
    assert set(_MOVES) == set(_State)
    assert _MOVES[_State.GONE] == frozenset()
    assert _MOVES[_State.OVER] == {_State.GONE}
    for state in set(_State) - {_State.OVER, _State.GONE}:
        assert _State.GONE in _MOVES[state] and _State.OVER in _MOVES[state], state


def test_a_move_the_table_does_not_list_raises_and_changes_nothing() -> None:
    follow = stream()
    follow._move(_State.OVER)
    with pytest.raises(AssertionError, match="cannot go from"):
        follow._move(_State.WAITING)
    assert follow.state is _State.OVER
    follow.hung_up()  # its client may still go: then no end is written
    assert follow.gone


def test_a_revocation_after_the_end_is_not_told() -> None:
    from session.errors import Unauthorized

    follow = stream()
    follow.close()
    follow.revoke(Unauthorized("revoked"))
    assert follow.state is _State.OVER and follow.revoked is None
