"""Envoy's Rate Limit Quota Service (RLQS) on the fleet's coordinator.

Each Envoy (or proxyless gRPC client) streams, per bucket, how many requests it
allowed and denied; ratewarden answers with an assignment per bucket, a token
bucket Envoy enforces locally with no call per request. Each stream is a member
of each bucket's fleet quota: its reports are its demand, its grant its
assignment, so that the assignments of every proxy never sum past the bucket's
total, split ``equal``-ly or by demand. See docs/rlqs.md.

- ``config``: the rule file's ``rlqs`` entries compiled (`BucketRule`), and the
  fleet resource of a bucket id;
- ``assignment``: a grant as the token bucket Envoy 1.40 enforces, no I/O;
- ``coordinators``: the coordinator in this process or in Redis;
- ``service``: the streams, their buckets and their reports (`QuotaService`).

The gRPC method itself is the service's (``ratewarden.server``).
"""

from .assignment import Assignment, assign
from .config import BucketRule, bucket_rules, resource_name
from .coordinators import Coordinators, LocalCoordinators, RedisCoordinators
from .service import MAX_BUCKETS, Action, QuotaService, QuotaStream, Stats, TooManyBuckets, Usage

__all__ = [
    "MAX_BUCKETS",
    "Action",
    "Assignment",
    "BucketRule",
    "Coordinators",
    "LocalCoordinators",
    "QuotaService",
    "QuotaStream",
    "RedisCoordinators",
    "Stats",
    "TooManyBuckets",
    "Usage",
    "assign",
    "bucket_rules",
    "resource_name",
]
