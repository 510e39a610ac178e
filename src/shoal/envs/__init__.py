"""Environment adapters: whatever the user passes becomes a source of gym.Env or a VectorEnv."""

from shoal.envs import memory
from shoal.envs.registry import check_env_id, env_creator, env_name, register_env, registered_envs
from shoal.envs.spaces import ActionSpec, ObsSpec, action_spec, obs_spec

__all__ = [
    "ActionSpec",
    "ObsSpec",
    "action_spec",
    "check_env_id",
    "env_creator",
    "env_name",
    "obs_spec",
    "register_env",
    "registered_envs",
]

memory.register()  # CartPoleNoVel-v1 and the other no-velocity ids
