"""Our HTTP/2 server (RFC 9113) and gRPC over it: a protocol layer apart from
the calls it carries (`ratewarden.server`'s gRPC service registers them).

``_connection`` reads frames and keeps the streams' state and the defences a
server facing clients needs, ``_send`` what a connection sends, ``_frames`` the
wire and HPACK, ``_listen`` what one listener's connections share, ``_grpc``
gRPC's framing, calls and status.
"""

from ._grpc import Call, GrpcError, H2Server, Metadata, Method, Status

__all__ = ["Call", "GrpcError", "H2Server", "Metadata", "Method", "Status"]
