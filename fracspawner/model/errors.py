"""The errors the model raises; each message is written for the person who caused it."""

from __future__ import annotations


class SliceError(ValueError):
    """A `gpu` value that is not a valid slice; the message says what is allowed."""


class CatalogError(ValueError):
    """A catalog problem; the message starts with the path of the offending key."""


class OptionsError(ValueError):
    """A user_options problem, worded for the person who chose them."""
