"""How swaps behave: the serve flags of zero-downtime updates, one frozen value (docs/updating-models.md)."""

from __future__ import annotations

from dataclasses import dataclass

from edge_runtime.config import UPDATE_POLICIES


@dataclass(frozen=True)
class UpdateSettings:
    """How swaps behave (serve flags; docs/updating-models.md)."""

    drain_seconds: float = 30.0
    # After a promotion the previous version stays resident this long, and the new one is watched:
    # past the bounds below it is rolled back automatically. 0 turns the watch off.
    watch_seconds: float = 60.0
    rollback_error_rate: float = 0.05  # new error rate minus the old one's
    rollback_p99_ratio: float = 3.0  # new p99 over the old one's
    rollback_min_requests: int = 50  # answers the new version must have given before it is judged
    memory_reserve_bytes: int = 0
    policy: str = "beside"
    watch_models_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.policy not in UPDATE_POLICIES:
            raise ValueError(f"policy must be one of {UPDATE_POLICIES}, not {self.policy!r}")


__all__ = ["UpdateSettings"]
