"""Text the lease table can store on every supported database: names and holders.

The name and holder columns are ``VARCHAR`` (``utf8mb4`` on MariaDB/MySQL, so 4-byte
characters fit and a length counts characters on every database). Two kinds of Python
string still cannot be stored, and one such value fails the whole statement that carries
it — with every other job's name in the same batch:

- a NUL character: PostgreSQL refuses it in text (SQLite and MariaDB store it);
- a lone surrogate (``'\\udc80'``, as `os.listdir` yields for undecodable bytes): it
  is not Unicode, so no driver can encode it as UTF-8.

Anything else round-trips unchanged on all three (``tests/test_lease.py`` stores control
characters, noncharacters, emoji and a 200-character name of 4-byte characters).
"""

from __future__ import annotations

from typing import Final

__all__ = ["HOLDER_LENGTH", "check_holder", "unstorable"]

#: The longest holder (replica id) the lease table stores, in characters.
HOLDER_LENGTH: Final = 255


def unstorable(text: str) -> str | None:
    """Say why ``text`` cannot be stored in the lease table, or return ``None``.

    Only the characters are judged, not the length: each column has its own limit.

    Returns:
        A phrase to follow the value in a message, e.g. "contains a NUL character at
        index 3, which PostgreSQL cannot store"; `None` when every database stores `text`
        unchanged.
    """
    nul = text.find("\x00")
    if nul >= 0:
        return f"contains a NUL character at index {nul}, which PostgreSQL cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"contains the lone surrogate {text[exc.start]!r} at index {exc.start}, "
            "which is not valid Unicode and no database can store"
        )
    return None


def check_holder(holder: str) -> str:
    """Check that ``holder`` (a replica id) fits the lease table's holder column.

    Call it where the id is chosen (``Scheduler`` does, at construction), so a bad id
    fails at once instead of failing every claim after the start.

    Returns:
        ``holder``, unchanged.

    Raises:
        ValueError: ``holder`` is not a string of 1 to `HOLDER_LENGTH` characters,
            or holds a character some database cannot store (see [unstorable][lease.unstorable]).
    """
    if not isinstance(holder, str) or not 0 < len(holder) <= HOLDER_LENGTH:
        shown = repr(holder)
        if isinstance(holder, str) and len(holder) > HOLDER_LENGTH:
            shown = f"{holder[:40]!r}... ({len(holder)} characters)"
        raise ValueError(
            f"a holder must be a string of 1 to {HOLDER_LENGTH} characters, not {shown}"
        )
    problem = unstorable(holder)
    if problem is not None:
        raise ValueError(f"holder {holder!r} {problem}")
    return holder
