"""The one error type for bad user input, and the message shape every reader uses.

A user with a week-long job needs to know *where* their input is wrong and *what* was expected, so
every reader raises `InputError` with the file (and line, record or JSON path) in the message.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: a file, line or record that does not hold what Cloze expects."""


def input_error(where: str, expected: str, found: str) -> InputError:
    """Builds an InputError that reads `<where>: expected <expected>, found <found>`.

    Args:
      where: the file, optionally with `:line`, ` record N` or a JSON path, e.g. "corpus.txt:17".
      expected: what Cloze needs there.
      found: what is there instead (keep it short; quote user text with repr()).
    """
    return InputError(f"{where}: expected {expected}, found {found}")
