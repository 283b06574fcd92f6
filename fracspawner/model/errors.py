"""The errors the model raises; each message is written for the person who caused it."""

from __future__ import annotations


class SliceError(ValueError):
    """A `gpu` value that is not a valid slice; the message says what is allowed."""


class CatalogError(ValueError):
    """A catalog problem; the message starts with the path of the offending key."""


class OptionsError(ValueError):
    """A user_options problem, worded for the person who chose them."""


#: the most of a user's value a message repeats back: a 100 kB pool name is not echoed whole
ECHO_MAX = 40


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    try:
        return repr(value)
    except ValueError:  # an int past Python's digit limit for str()
        return "a number too large to show"


def echo(value: object) -> str:
    """A user's value as a message repeats it: Python-quoted with control characters escaped,
    cut to ECHO_MAX characters with '…' after the cut ('aaaa…')."""
    text = _text(value)
    if len(text) > ECHO_MAX:
        return repr(text[:ECHO_MAX] + "…")
    return repr(text) if isinstance(value, str) else text


def quote(value: object) -> str:
    """The same in double quotes, as catalog messages write specs ("0.3")."""
    text = _text(value)
    cut = len(text) > ECHO_MAX
    if not isinstance(value, str) and not cut:
        return text
    body = repr(text[:ECHO_MAX] + ("…" if cut else ""))[1:-1].replace('"', '\\"')
    return f'"{body}"'
