"""Framework integrations, each its own module behind its own extra.

Protect your API (the rule engine decides, the middleware answers):

- `ratewarden.integrations.asgi`: `RateLimitMiddleware` for any ASGI app
  (Starlette, FastAPI, ...), no dependency;
- `ratewarden.integrations.fastapi`: `RateLimit`, a per-route dependency
  (``ratewarden[fastapi]``);
- `ratewarden.integrations.wsgi`: `RateLimitMiddleware` for any WSGI app;
- `ratewarden.integrations.flask`: the `RateLimiter` extension and a per-view
  decorator (``ratewarden[flask]``);
- `ratewarden.integrations.django`: middleware and a view decorator, sync and
  async (``ratewarden[django]``).

Obey someone else's limit (a permit before each outgoing call):

- `ratewarden.integrations.httpx`: sync and async transports (``ratewarden[httpx]``);
- `ratewarden.integrations.aiohttp`: a client middleware (``ratewarden[aiohttp]``);
- ``Limiter.slot`` / ``AsyncLimiter.slot`` for any other callable.

This package imports nothing itself, so importing one integration never pulls
another's framework in.
"""

__all__: list[str] = []
