"""Redis Streams: each instant added to a stream once, and a worker fleet that checks
what it reads before it runs it (``pip install 'cronjob-lease[redis]'``).

::

    from cronjob.contrib import streams

    cronjob.register(streams.publish("redis://127.0.0.1:6379/0", stream="jobs"),
                     "0 0 3 * * *", "nightly")

    @streams.handler("nightly")            # on the worker side
    def nightly(occ: streams.Occurrence) -> None: ...

    streams.Worker("redis://127.0.0.1:6379/0", stream="jobs", group="workers").run()

Layout: `_publish` (the publisher and its Lua script), `_handlers` (handlers and what
they get), `_worker` (the consumer and its dispositions), `_metrics` (the counters),
`_cli` (``cronjob stream-worker``). The checks are shared with the other targets
(`cronjob.contrib._validation`). See docs/task-queues/streams.md.
"""

from ._publish import DEDUP_PREFIX as DEDUP_PREFIX
from ._publish import DEDUP_TTL as DEDUP_TTL
from ._publish import PUBLISH_IF_NEW as PUBLISH_IF_NEW
from ._publish import StreamPublisher as StreamPublisher
from ._publish import entry_fields as entry_fields
from ._publish import publish as publish

__all__ = [
    "DEDUP_PREFIX",
    "DEDUP_TTL",
    "PUBLISH_IF_NEW",
    "StreamPublisher",
    "entry_fields",
    "publish",
]

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith(__name__ + "._"):
        _obj.__module__ = __name__
del _name, _obj
