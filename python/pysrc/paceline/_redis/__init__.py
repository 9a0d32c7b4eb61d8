"""The Redis tier behind ``paceline.redis``: ``core`` (scripts, errors, checks, the
limiters' shared base), ``wire`` (asyncio calls to Redis), ``limiter_sync`` (the limiter
for threads), ``budget`` (the fleet budget's decisions, sans I/O) with its asyncio and
thread shells ``budget_async`` and ``budget_sync``. ``paceline.redis`` is the public face."""
