"""The fleet tests' fixtures on a real Redis (defined in `tests.fleet.members`)."""

from tests.fleet.members import client, name

__all__ = ["client", "name"]
