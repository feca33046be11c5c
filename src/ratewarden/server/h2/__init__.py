"""Our HTTP/2 server (RFC 9113) and gRPC over it: a protocol layer apart from
the calls it carries (`ratewarden.server`'s gRPC service registers them).

A connection is built in layers, a module each: ``_send`` what it sends,
``_control`` the control frames and the flood budget, ``_streams`` the request
header blocks, DATA and the streams' state, ``_connection`` the reading of
frames, the deadlines and the end (and the list of the defences a server facing
clients needs). ``_frames`` is the wire and HPACK, ``_listen`` what one
listener's connections share, ``_grpc`` gRPC's framing, calls and status.
"""

from ._grpc import Call, GrpcError, H2Server, Metadata, Method, Status

__all__ = ["Call", "GrpcError", "H2Server", "Metadata", "Method", "Status"]
