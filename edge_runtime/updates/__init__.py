"""Zero-downtime model updates: change detection, load beside, verify, switch, drain, roll back,
and the memory guard (docs/updating-models.md)."""

from edge_runtime.updates.identity import Change, Identity, identity, incomplete, plan
from edge_runtime.updates.manager import Updates
from edge_runtime.updates.memory import Budget, Need, budget, package_need
from edge_runtime.updates.operations import Operation
from edge_runtime.updates.settings import UpdateSettings

__all__ = ["Budget", "Change", "Identity", "Need", "Operation", "UpdateSettings", "Updates", "budget",
           "identity", "incomplete", "package_need", "plan"]
