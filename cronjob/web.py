"""The status page, as a WSGI or an ASGI app an application mounts where it chooses.

It reads what [cronjob.admin.status][] and [cronjob.admin.history][] read, and never
writes.

```python
from cronjob import web

# Flask / any WSGI:  DispatcherMiddleware(app, {"/cronjob": web.wsgi_app(url)})
# Starlette/FastAPI: app.mount("/cronjob", web.asgi_app(url))
```
"""

# The public name of cronjob.admin._web, where the pages are made.

from __future__ import annotations

from .admin._web import HEADERS as HEADERS
from .admin._web import ROUNDS_SHOWN as ROUNDS_SHOWN
from .admin._web import ASGIApp as ASGIApp
from .admin._web import WSGIApp as WSGIApp
from .admin._web import asgi_app as asgi_app
from .admin._web import serve as serve
from .admin._web import wsgi_app as wsgi_app

__all__ = ["asgi_app", "serve", "wsgi_app"]
