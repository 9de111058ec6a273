"""Exceptions for mistakes a user can fix."""


class UserError(Exception):
    """A mistake the user can fix: the command line prints it as one sentence
    on stderr, without a traceback, and exits with code 1."""
