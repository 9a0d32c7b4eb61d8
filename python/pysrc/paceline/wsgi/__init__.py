"""Rate limiting for WSGI servers (gunicorn sync and gthread workers, uWSGI, waitress,
mod_wsgi), per client: the ``paceline.asgi`` limits, decisions and answers for PEP 3333
apps, and the base that ``paceline.flask`` and ``paceline.django`` build on.

::

    from paceline.wsgi import Limit, RateLimitMiddleware

    app.wsgi_app = RateLimitMiddleware(
        app.wsgi_app,
        limits=[Limit("per-ip", "20/second", storage_uri="file:///dev/shm/myapp")],
    )

Under ``gunicorn -w 4`` a limit kept in memory (``memory://``, the default) is counted
by each worker on its own, so a client gets 4 times its limit: keep it in a file every
worker of the host opens (``storage_uri="file:///dev/shm/myapp"``) or in Redis
(``"redis://..."``); the middleware logs a warning the first time a worker serves a
request with such a limit.
"""

from __future__ import annotations

from .._http.checker import Admitted, Refused, RefusalInfo
from .._http.limit import KeySource, Limit, Rate
from ._middleware import RateLimitMiddleware

__all__ = ["KeySource", "Limit", "Rate", "RateLimitMiddleware", "RefusalInfo", "Admitted", "Refused"]
