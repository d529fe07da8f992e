"""The `shigoto` command line: `commands` parses and dispatches; `demo` and `bench` are the two
commands with a module of their own. It is the top layer: nothing else imports it."""

from shigoto.cli.commands import main

__all__ = ["main"]
