"""The error module: one class per wire code (``BY_CODE``, which the Redis store rebuilds
a script's refusal with)."""

from __future__ import annotations

from session import errors
from session.errors import BY_CODE, Code, ReplError


def error_classes() -> list[type[ReplError]]:
    return [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, ReplError) and value is not ReplError
    ]


def test_every_code_belongs_to_exactly_one_error_class() -> None:
    classes = error_classes()
    assert sorted(cls.code for cls in classes) == sorted(Code)
    assert {code: cls.code for code, cls in BY_CODE.items()} == {c.value: c for c in Code}
    assert set(BY_CODE.values()) == set(classes)


def test_every_error_class_says_what_it_means_in_a_docstring() -> None:
    for cls in error_classes():
        assert cls.__doc__, cls.__name__


def test_a_code_is_its_wire_string() -> None:
    assert str(Code.ACK_AFTER_HEAD) == "ack_after_head"
    assert str(Code.CURSOR_AFTER_HEAD) == "cursor_after_head"


def test_the_base_error_is_internal() -> None:
    assert ReplError("x").code == Code.INTERNAL
