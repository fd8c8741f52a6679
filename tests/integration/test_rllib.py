"""RLlib's env runners stepping through shmvec (shmvec.integrations.rllib), with the real RLlib.

``ray[rllib]`` pins its own Gymnasium (1.2.x), so it lives in a venv of its own (.ci/more makes one);
where RLlib is not installed these tests skip.  Each case runs as a user's script runs: a fresh
interpreter that starts Ray, builds PPO with ``use_shmvec``, trains one iteration, asks every env
runner what its env is, and stops Ray (so nothing of Ray outlives the test).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import pythonpath

# ray[rllib] brings dm-tree (module tree); its PPO learner is torch's.
_MISSING = [m for m in ("ray", "tree", "torch") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"needs ray[rllib] and torch ({', '.join(_MISSING)} not "
                                "installed here): RLlib pins its own Gymnasium, so .ci/more runs these in a venv of its own")

SCRIPT = textwrap.dedent("""
    import json, sys
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from shmvec.integrations.rllib import use_shmvec

    if __name__ == "__main__":
        env_id, runners = sys.argv[1], int(sys.argv[2])
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # a cluster of its own
        try:
            config = (PPOConfig().environment(env_id)
                      .env_runners(num_env_runners=runners, num_envs_per_env_runner=4, rollout_fragment_length=32)
                      .training(train_batch_size_per_learner=128, minibatch_size=64, num_epochs=1))
            algo = use_shmvec(config, start_method="forkserver").build_algo()
            result = algo.train()

            def what(runner):
                env = runner.env.unwrapped
                return [type(env).__module__ + "." + type(env).__name__, env.num_envs, env.n_workers]

            runners_seen = algo.env_runner_group.foreach_env_runner(what, local_env_runner=runners == 0)
            sampled = result["env_runners"]["num_env_steps_sampled_lifetime"]
            print(json.dumps({"runners": runners_seen, "sampled": sampled, "env": algo.config.env}))
            algo.stop()
        finally:
            ray.shutdown()
""")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("runners", [0, 1], ids=["local-runner", "remote-runner"])
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1"])
def test_one_ppo_iteration_steps_shmvec_on_every_runner(env_id, runners, tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, env_id, str(runners)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=280, env={**os.environ, "PYTHONPATH": pythonpath()})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["env"] == f"shmvec:{env_id}"
    assert out["runners"], out
    for kind, num_envs, n_workers in out["runners"]:
        assert kind == "shmvec.shm_vector_env.ShmVectorEnv" and num_envs == 4, out
        if runners:  # a remote runner: as many workers as the CPUs Ray gave it (1 by default)
            assert n_workers == 1, out
    assert out["sampled"] >= 128, out


def test_use_shmvec_refuses_a_config_without_an_env():
    from ray.rllib.algorithms.ppo import PPOConfig

    from shmvec.integrations.rllib import use_shmvec

    with pytest.raises(ValueError, match="has no env"):
        use_shmvec(PPOConfig())
    with pytest.raises(ValueError, match="register_env"):
        use_shmvec(PPOConfig().environment(lambda cfg: None))


def test_the_creator_builds_one_env_or_a_shm_vector_env():
    from shmvec import ShmVectorEnv
    from shmvec.integrations.rllib import ShmEnvCreator

    creator = ShmEnvCreator("CartPole-v1", n_workers=1, start_method="fork")
    one = creator({"max_episode_steps": 7})
    assert one.spec.max_episode_steps == 7 and not isinstance(one, ShmVectorEnv)
    one.close()
    envs = creator({"num_envs": 3, "max_episode_steps": 7})
    try:
        assert isinstance(envs, ShmVectorEnv) and envs.num_envs == 3 and envs.n_workers == 1
    finally:
        envs.close()
