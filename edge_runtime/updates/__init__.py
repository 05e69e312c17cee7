"""Zero-downtime model updates: change detection, load beside, verify, switch, drain, roll back,
and the memory guard (docs/updating-models.md)."""

from edge_runtime.updates.identity import Change, Identity, identity, incomplete, plan
from edge_runtime.updates.manager import Operation, Updates, UpdateSettings
from edge_runtime.updates.memory import Budget, Need, budget, package_need

__all__ = ["Budget", "Change", "Identity", "Need", "Operation", "UpdateSettings", "Updates", "budget",
           "identity", "incomplete", "package_need", "plan"]
