"""The routing decision as one pipeline: session → filter → score → pick → commit.

- `pipeline.Pipeline`: the decision for one request (ext_proc's transports and the simulator
  call it and nothing else);
- `policy`: the policy interface, and `StaticPolicy` (stickiness on the ring);
- `gated.GatedPolicy`: the load gate (filter: ring candidates under the load bound; score:
  kvgate.placement.terms; pick: the least estimate), with its booking hook (`booking.Ledger`);
- `build.build_policy`: the policy from its settings (ext_proc, the simulator, bench);
- `recent`: what the gate remembers between requests; `engine_load`: its live load feed.
"""

from kvgate.routing.build import build_policy
from kvgate.routing.decision import (
    Decision,
    DecisionError,
    NoActiveEndpoint,
    Outcome,
    UnknownPool,
)
from kvgate.routing.gated import GatedPolicy
from kvgate.routing.pipeline import Pipeline
from kvgate.routing.policy import (
    STATIC,
    HbmResidency,
    Policy,
    PoolResidency,
    PromptSize,
    StaticPolicy,
)

__all__ = [
    "STATIC", "Decision", "DecisionError", "GatedPolicy", "HbmResidency", "NoActiveEndpoint",
    "Outcome",
    "Pipeline", "Policy", "PoolResidency", "PromptSize", "StaticPolicy", "UnknownPool",
    "build_policy",
]
