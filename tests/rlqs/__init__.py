"""Tests of Envoy's quota service (``ratewarden.rlqs``)."""

# One rlqs entry most tests use: a bucket per tenant of 200/second.
API_RULES = """
rlqs:
  - name: api
    domain: envoy
    bucket: {name: api, tenant: "*"}
    rate: 200/second
"""
ACME = {"name": "api", "tenant": "acme"}
