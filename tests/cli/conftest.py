"""The quota command's tests on a real Redis use the fleet tests' fixtures: a
client of the test's server and a fresh resource name (`tests.fleet.members`)."""

from tests.fleet.members import client, name

__all__ = ["client", "name"]
