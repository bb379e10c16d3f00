"""Team policy as code (teams.yaml) and what is derived from it."""

from nuro.policy.model import (
    Policy,
    PolicyError,
    Team,
    Tier,
    borrow_qos,
    guaranteed_qos,
    load_policy,
    parse_policy,
    policy_to_yaml_dict,
)

__all__ = [
    "Policy",
    "PolicyError",
    "Team",
    "Tier",
    "borrow_qos",
    "guaranteed_qos",
    "load_policy",
    "parse_policy",
    "policy_to_yaml_dict",
]
