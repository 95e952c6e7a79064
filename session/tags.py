"""Tags on firings, and the matches that readers select firings by.

A firing may carry up to ``MAX_TAGS`` tags, ``KEY=VALUE``: a key of
``[a-z0-9][a-z0-9._-]{0,63}``, a value of any text up to ``MAX_TAG_VALUE``
characters. They are stored with the firing like the rest of it, and a
reader may ask only for the firings whose tags match: ``Match`` holds what
must hold (every tag it names equal to its value, or only there when its
value is None), and optionally the firing's handler. A match never changes
what a read counts as lost or where its ``next`` is: it only leaves out
the firings that do not match (docs/semantics.md, rules R1-R4).

``correlation_id`` makes the fresh id that request/reply tags a request
with; ``parse_tag`` and ``parse_match`` read the CLI's ``KEY=VALUE`` words.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping

import msgspec

from session.errors import BadTag

#: the most tags a firing may carry
MAX_TAGS = 16
#: the longest a tag's value may be, in characters
MAX_TAG_VALUE = 1024
#: the tags request and reply use: where the reply goes, and which request it answers
REPLY_TO, CORR = "reply-to", "corr"
#: the key no tag may have: a match on it is a match on who sent the firing (its ``by``,
#: which the daemon records and no client sets)
BY = "by"
#: the senders the daemon names itself: the root token, a timer's firing, a webhook's
ROOT, TIMER, WEBHOOK = "root", "timer", "webhook"

_KEY = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")

#: a firing's tags: what it carries (an empty dict when none)
Tags = dict[str, str]


@functools.lru_cache(maxsize=4096)
def check_tag_key(key: str) -> str:
    """``key`` when it is one; remembered, since the same few keys come on every send
    (the regular expression was a tenth of a tagged send's CPU). A refusal raises, and
    an exception is never remembered."""
    if not _KEY.fullmatch(key):
        raise BadTag(
            f"tag key {key!r} is not 1-64 of a-z 0-9 . _ - starting with a letter or digit"
        )
    return key


#: keys that passed ``check_tags``: the same few come on every send (forgotten all at once
#: when there are more, as ``session.packed`` forgets its seconds)
_known_keys: set[str] = set()
KNOWN_KEYS = 4096


def check_tags(tags: Mapping[str, str]) -> Mapping[str, str]:
    """``tags`` as a firing may carry them; ``BadTag`` naming the first thing wrong."""
    # Keys all seen before and values all text short enough: every send's tags but the
    # first. One set test and one look at each value cost a tagged send 0.3 µs less than
    # the loop below (0.57 µs for 4), which tells what is wrong, in order, when anything is.
    if len(tags) <= MAX_TAGS and _known_keys.issuperset(tags):
        for value in tags.values():
            if not isinstance(value, str) or len(value) > MAX_TAG_VALUE:
                break
        else:
            return tags
    if len(tags) > MAX_TAGS:
        raise BadTag(f"{len(tags)} tags: a firing carries at most {MAX_TAGS}")
    for key, value in tags.items():
        check_tag_key(key)
        if key == BY:
            raise BadTag(
                "tag 'by' is the daemon's: it records who sent each firing, and no sender sets it"
            )
        if not isinstance(value, str):
            raise BadTag(f"tag {key!r}: its value must be text")
        if len(value) > MAX_TAG_VALUE:
            raise BadTag(
                f"tag {key!r}: its value is {len(value):,} characters, over {MAX_TAG_VALUE:,}"
            )
    if len(_known_keys) + len(tags) > KNOWN_KEYS:
        _known_keys.clear()
    _known_keys.update(tags)
    return tags


def parse_tag(word: str) -> tuple[str, str]:
    """``KEY=VALUE`` (the CLI's ``--tag``) as its key and value, the key checked."""
    key, sep, value = word.partition("=")
    if not sep:
        raise BadTag(f"tag {word!r} is not KEY=VALUE")
    return check_tag_key(key), value


def parse_tags(words: Iterable[str]) -> Tags:
    """The ``--tag`` words as tags; a key given twice is refused (which would win?)."""
    tags: Tags = {}
    for word in words:
        key, value = parse_tag(word)
        if key in tags:
            raise BadTag(f"tag {key!r} is given twice")
        tags[key] = value
    check_tags(tags)
    return tags


class Match(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a firing must be for a matching reader: each of ``tags`` there, with its value
    (None: any value), and of ``handler`` when it names one. The key ``by`` (which no tag
    has) is the firing's sender: ``by=NAME`` holds for what NAME sent, ``by`` alone for
    any firing whose sender is known."""

    tags: dict[str, str | None] = msgspec.field(default_factory=dict)
    handler: str | None = None

    def check(self) -> Match:
        if not self.tags and self.handler is None:
            raise BadTag("a match names at least one tag or a handler")
        if len(self.tags) > MAX_TAGS:
            raise BadTag(f"a match names {len(self.tags)} tags, over the {MAX_TAGS} a firing has")
        for key, value in self.tags.items():
            check_tag_key(key)
            if value is not None and len(value) > MAX_TAG_VALUE:
                raise BadTag(f"match {key!r}: its value is over {MAX_TAG_VALUE:,} characters")
        return self

    def holds(self, handler: str, tags: Mapping[str, str], by: str | None = None) -> bool:
        """Whether a firing of ``handler`` carrying ``tags``, sent by ``by``, matches."""
        if self.handler is not None and handler != self.handler:
            return False
        for key, value in self.tags.items():
            have = by if key == BY else tags.get(key)
            if have is None or (value is not None and have != value):
                return False
        return True

    def plan(
        self, handler: str, keys: tuple[str, ...], by: str | None = None
    ) -> list[tuple[int, bytes]] | None:
        """What a firing of ``handler`` whose tags have ``keys`` (in that order), sent by
        ``by``, must hold to match, as a packed firing keeps its tags (``session.packed``):
        each value's position among ``keys`` and the value, UTF-8. None when no such
        firing matches, whatever its values; an empty plan when every one does."""
        if self.handler is not None and handler != self.handler:
            return None
        plan: list[tuple[int, bytes]] = []
        for key, value in self.tags.items():
            if key == BY:
                if by is None or (value is not None and by != value):
                    return None
            elif key not in keys:
                return None
            elif value is not None:
                try:
                    plan.append((keys.index(key), value.encode()))
                except UnicodeEncodeError:  # a lone surrogate: no packed value has one
                    return None
        return plan


def parse_match(
    words: Iterable[str], handler: str | None = None, twice: str = "--match {!r} is given twice"
) -> Match | None:
    """The ``--match`` words (``KEY=VALUE`` or ``KEY``) and ``--handler``: all must hold.
    None when there are none. ``twice`` words a key given twice, as the interface names
    the option (the CLI's ``--match``, HTTP's ``?match=``)."""
    tags: dict[str, str | None] = {}
    for word in words:
        key, sep, value = word.partition("=")
        check_tag_key(key)
        if key in tags:
            raise BadTag(twice.format(key))
        tags[key] = value if sep else None
    if not tags and handler is None:
        return None
    return Match(tags, handler).check()


def correlation_id() -> str:
    """A fresh id for a request's ``corr`` tag: 96 random bits, never reused in practice."""
    # secrets.token_hex is this; importing secrets (random, hmac, OpenSSL) costs `repl` ms
    return f"c-{os.urandom(12).hex()}"
