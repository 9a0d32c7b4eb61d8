"""The request decision every server integration shares, on a plain request head (method,
path, headers, the client's address): the limits (``limit``), the Rust layer's decision
and what Python adds around it (``checker``), and the limits kept in Redis (``fleet``).
No framework and no I/O of a server's in here: ``paceline.asgi``, ``paceline.wsgi``,
``paceline.flask`` and ``paceline.django`` are shells that turn their request into a head
and the outcome into their response."""
