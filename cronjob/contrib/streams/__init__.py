"""Redis Streams: each instant added to a stream once, and a worker fleet that checks
what it reads before it runs it (``pip install 'cronjob-lease[redis]'``).

```python
from cronjob.contrib import streams

cronjob.register(streams.publish("redis://127.0.0.1:6379/0", stream="jobs"),
                 "0 0 3 * * *", "nightly")

@streams.handler("nightly")            # on the worker side
def nightly(occ: streams.Occurrence) -> None: ...

streams.Worker("redis://127.0.0.1:6379/0", stream="jobs", group="workers").run()
```

See [Redis Streams](../../task-queues/streams.md) for the dispositions of what a worker reads.
"""

# Layout: _publish (the publisher and its Lua script), _handlers (handlers and what they
# get), _worker (the consumer and its dispositions), _metrics (the counters), _cli
# (cronjob stream-worker). The checks are shared with the other targets
# (cronjob.contrib._validation).

from ._handlers import Handler as Handler
from ._handlers import Handlers as Handlers
from ._handlers import Occurrence as Occurrence
from ._handlers import default_handlers as default_handlers
from ._handlers import handler as handler
from ._publish import DEDUP_PREFIX as DEDUP_PREFIX
from ._publish import DEDUP_TTL as DEDUP_TTL
from ._publish import PUBLISH_IF_NEW as PUBLISH_IF_NEW
from ._publish import StreamPublisher as StreamPublisher
from ._publish import entry_fields as entry_fields
from ._publish import publish as publish
from ._worker import DEAD_SUFFIX as DEAD_SUFFIX
from ._worker import Disposition as Disposition
from ._worker import Worker as Worker

__all__ = [
    "DEAD_SUFFIX",
    "DEDUP_PREFIX",
    "DEDUP_TTL",
    "PUBLISH_IF_NEW",
    "Disposition",
    "Handler",
    "Handlers",
    "Occurrence",
    "StreamPublisher",
    "Worker",
    "default_handlers",
    "entry_fields",
    "handler",
    "publish",
]

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith(__name__ + "._"):
        _obj.__module__ = __name__
del _name, _obj
