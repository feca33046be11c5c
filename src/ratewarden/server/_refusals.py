"""The requests the service refuses, as exceptions that both front ends answer
with the message: the HTTP API with the exception's ``status``, gRPC with
INVALID_ARGUMENT.
"""

from __future__ import annotations

from ..primitives import RatewardenError

__all__ = ["InvalidRequest", "NotFound", "Unprocessable"]


class InvalidRequest(RatewardenError, ValueError):
    """A request the service cannot check (no attributes, empty descriptors, ...):
    HTTP answers ``status`` (400), gRPC INVALID_ARGUMENT, both with this message."""

    status = 400


class Unprocessable(InvalidRequest):
    """Well-formed JSON whose values the service does not take (an attribute
    that is not a string): HTTP 422, as for the decoder's own type errors."""

    status = 422


class NotFound(InvalidRequest):
    """A domain or rule the service does not know: HTTP 404."""

    status = 404
