"""Several policies: the checks of ``policies``, ``policies_to_train`` and a ``policy_mapping_fn``
dict, and each policy's config (the run's config with the policy's overrides, ``POLICY_KEYS`` only)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar, cast

from shoal.errors import ConfigError, did_you_mean, shorten

if TYPE_CHECKING:
    from shoal.config.trainer import TrainerConfig

C = TypeVar("C", bound="TrainerConfig")


def check_policies(c: TrainerConfig) -> None:
    """``policies`` made a dict of overrides (a list of ids is one of empty ones), each override
    checked, and every policy named elsewhere one of them."""
    if c.policies is None:
        if c.policies_to_train is not None or isinstance(c.policy_mapping_fn, dict):
            raise ConfigError(
                "policies_to_train and a policy_mapping_fn dict name policies; set policies too, "
                "e.g. policies={'main': {}, 'opponent': {}}."
            )
        return
    if isinstance(c.policies, list):
        c.policies = dict.fromkeys(c.policies)
    if not c.policies:
        raise ConfigError("policies is empty; name at least one policy or leave it unset.")
    c.policies = {pid: dict(spec or {}) for pid, spec in c.policies.items()}
    for pid in c.policies:
        with_policy_overrides(c, pid)  # every override checked now, not when the trainer is half built
    named = list(c.policies_to_train or [])
    if isinstance(c.policy_mapping_fn, dict):
        named += c.policy_mapping_fn.values()
    for pid in named:
        if pid not in c.policies:
            raise ConfigError(
                f"{shorten(repr(pid))} is not one of the policies {shorten(str(list(c.policies)))}."
                f"{did_you_mean(str(pid), c.policies)}"
            )


def with_policy_overrides(c: C, policy_id: str) -> C:
    """``c`` with policy ``policy_id``'s overrides applied (validated)."""
    # a list of ids is a dict of empty overrides once validated (check_policies)
    policies = cast("dict[str, dict[str, Any]] | None", c.policies)
    overrides = (policies or {}).get(policy_id) or {}
    policy = f"policy {shorten(repr(policy_id))}"
    for key in overrides:
        if key not in c.POLICY_KEYS:
            raise ConfigError(
                f"{policy} overrides {shorten(repr(key))}, which is not a per-policy key."
                f"{did_you_mean(key, c.POLICY_KEYS)} Per-policy keys: {', '.join(c.POLICY_KEYS)}."
            )
    if not overrides:
        return c
    fields = c.settings() | {"policies": None, "policies_to_train": None, "policy_mapping_fn": None}
    model_config = overrides.get("model_config", {})
    if not isinstance(model_config, dict):
        raise ConfigError(
            f"{policy} overrides model_config with {shorten(repr(model_config))}; it must be a dict of "
            f"model_config keys, e.g. {{'hiddens': [32, 32]}}."
        )
    overrides = overrides | {"model_config": c.model_options | model_config}
    try:
        return type(c).build(**fields | overrides)
    except ConfigError as e:
        raise ConfigError(f"{policy}: {e}") from None
