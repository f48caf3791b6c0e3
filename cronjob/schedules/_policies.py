"""A schedule's own policies: the ones a schedule made of data may set for itself, checked
at the call as registration checks them, stored as JSON, and laid over its task's.

A schedule sets ``overlap``, ``catch_up``, ``catch_up_window``, ``jitter`` and
``heartbeat`` for itself (`OWN_POLICIES`); each one it leaves unset (``None``) is its
task's. The others stay the task's alone: the hooks (``on_success``, ``on_failure``) are
code, which data cannot hold; ``timeout``, ``retries``, ``retry_backoff``,
``start_deadline``, ``pause_after_failures`` and ``isolation`` say how the task's code
is run and bounded, which its author knows, not the row (see docs/decisions.md).

Stored as the canonical JSON of the values as given (after the check): an enum by its
value, a duration in seconds, the URL as is: ``{"jitter":30.0,"overlap":"buffer_one"}``.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.parse
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final, cast

import lease

from .._exceptions import RegistrationError, ScheduleError
from .._policy import CatchUp, Overlap, Policy, PolicyOptions, make_policy

__all__ = [
    "MAX_POLICIES_BYTES",
    "OWN_POLICIES",
    "described",
    "own_of",
    "policies_json",
    "with_own",
]

#: The policies a schedule may set for itself, in the order they are shown.
OWN_POLICIES: Final = ("overlap", "catch_up", "catch_up_window", "jitter", "heartbeat")
#: The most a schedule's own policies may take, encoded as JSON (a long heartbeat URL).
MAX_POLICIES_BYTES: Final = 4096


def policies_json(id_: str, given: Mapping[str, object]) -> str | None:
    """The JSON stored for the policies schedule ``id_`` sets for itself (``given``: each
    of `OWN_POLICIES`, ``None`` when unset), or ``None`` when it sets none.

    Raises:
        RegistrationError: a value registration would refuse (the same message, naming
            the schedule): an ``overlap`` or ``catch_up`` that is not one of its values,
            a ``catch_up_window`` or ``jitter`` that is not a positive number of seconds
            or ``timedelta``, a ``heartbeat`` that is not an ``http(s)`` URL with a
            host; or policies that take over `MAX_POLICIES_BYTES` as JSON.
    """
    options = {key: given[key] for key in OWN_POLICIES if given.get(key) is not None}
    if not options:
        return None
    try:
        policy = make_policy(id_, leased=True, options=cast(PolicyOptions, options))
    except RegistrationError as exc:
        # Registration's own message, naming the schedule: "job 'x': ..." -> "schedule 'x': ...".
        message = str(exc).replace(f"job {id_!r}:", f"schedule {id_!r}:", 1)
        raise RegistrationError(message) from exc
    stored: dict[str, object] = {}
    for key in options:
        value = getattr(policy, key)
        if isinstance(value, Overlap | CatchUp):
            stored[key] = value.value
        elif isinstance(value, timedelta):
            stored[key] = value.total_seconds()
        else:
            stored[key] = value
    text = json.dumps(stored, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_POLICIES_BYTES:
        raise RegistrationError(
            f"schedule {id_!r}: its policies take {size} bytes as JSON; the limit is "
            f"{MAX_POLICIES_BYTES}"
        )
    problem = lease.unstorable(text)
    if problem is not None:
        raise RegistrationError(f"schedule {id_!r}: policies {problem}")
    return text


def own_of(id_: str, text: str | None) -> dict[str, Any]:
    """The policies stored as ``text`` for schedule ``id_``, as the fields of a
    [Policy][cronjob.Policy] (enums, ``timedelta``); ``{}`` for ``None``.

    Raises:
        ScheduleError: ``text`` is not what `policies_json` writes (a row edited by hand):
            the schedule is not run rather than run without what it asks.
    """
    if text is None:
        return {}
    try:
        stored = json.loads(text)
        if not isinstance(stored, dict) or not set(stored) <= set(OWN_POLICIES):
            raise ValueError(f"expected an object of {', '.join(OWN_POLICIES)}")
        policy = make_policy(id_, leased=True, options=cast(PolicyOptions, stored))
    except (ValueError, TypeError) as exc:  # RegistrationError is a ValueError
        raise ScheduleError(
            f"schedule {id_!r}: its policies {text!r} are not valid: {exc}"
        ) from exc
    return {key: getattr(policy, key) for key in stored}


def with_own(policy: Policy, id_: str, text: str | None) -> Policy:
    """``policy`` (its task's) with the policies schedule ``id_`` sets for itself laid
    over it (`own_of` raises for a malformed ``text``)."""
    own = own_of(id_, text)
    return dataclasses.replace(policy, **own) if own else policy


def described(text: str | None) -> dict[str, object]:
    """The policies stored as ``text`` as operators see them: JSON-ready, the heartbeat
    by its host only (the path of a ping URL is its check's key), as
    [Policy.describe][cronjob.Policy.describe] shows a job's. Never raises: a value that
    is not understood is shown as stored."""
    if text is None:
        return {}
    try:
        stored = json.loads(text)
    except ValueError:
        return {"policies": text}
    if not isinstance(stored, dict):
        return {"policies": text}
    shown: dict[str, object] = {}
    order = {key: at for at, key in enumerate(OWN_POLICIES)}
    for key in sorted(stored, key=lambda k: order.get(k, len(order))):
        value = stored[key]
        if key == "heartbeat" and isinstance(value, str):
            try:
                value = urllib.parse.urlsplit(value).hostname or "?"
            except ValueError:
                value = "?"
        shown[key] = value
    return shown
