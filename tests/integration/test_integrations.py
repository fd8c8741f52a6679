"""Each library of docs/integrations.md against the real library, with the one change its section shows.

One class per library; a class skips, saying why, where its library is not installed (they are the
``integrations`` extra of pyproject.toml).  References: TorchRL's ``GymWrapper`` over Gymnasium's
``SyncVectorEnv``, Gymnasium's ``SyncVectorEnv``, Tianshou's ``DummyVectorEnv``, on the same seeds.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import shmvec
import vector_registered  # noqa: F401  (registers ShmvecRegistered-v0)
from helpers import TESTS_DIR, assert_same, pythonpath
from shmvec import ShmVecEnvError, ShmVectorEnv, make_env


def _import(name: str):
    """The library, imported here (before the leak check's snapshots: its first import opens files), or None."""
    if importlib.util.find_spec(name) is None:
        return None
    return importlib.import_module(name)


torchrl = _import("torchrl")
tianshou = _import("tianshou")
HAVE_RL_ZOO = importlib.util.find_spec("rl_zoo3") is not None
if torchrl is not None:
    import torch
    from torchrl.collectors import Collector as TorchRLCollector
    from torchrl.envs import GymWrapper
if tianshou is not None:
    from tianshou.algorithm.algorithm_base import Policy as TianshouPolicy
    from tianshou.data import Batch, Collector as TianshouCollector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv

    class ObsHashPolicy(TianshouPolicy):
        """A deterministic policy whose CartPole episodes are short and uneven (no RNG to share)."""

        def forward(self, batch, state=None, **kwargs):
            obs = np.asarray(batch.obs)
            return Batch(act=np.abs(obs * 1e4).sum(1).astype(np.int64) % 2, state=state)

NOT_INSTALLED = "{} is not installed (pip install -c constraints.txt -e .[integrations])"


@pytest.mark.skipif(torchrl is None, reason=NOT_INSTALLED.format("torchrl"))
class TestTorchRL:
    @staticmethod
    def _pair(mode: str, n: int = 4):
        from shmvec.integrations.torchrl import make_torchrl_env

        ours = make_torchrl_env("CartPole-v1", n, autoreset_mode=mode, vector_kwargs={"n_workers": 2})
        ref = GymWrapper(gym.make_vec("CartPole-v1", n, vectorization_mode="sync",
                                      vector_kwargs={"autoreset_mode": AutoresetMode(mode)}))
        return ours, ref

    @pytest.mark.parametrize("mode", ["Disabled", "SameStep"])
    def test_rollout_equals_torchrl_over_sync_vector_env(self, mode):
        ours, ref = self._pair(mode)
        try:
            assert ours.batch_size == ref.batch_size == torch.Size([4])
            out = []
            for env in (ours, ref):
                env.set_seed(7)
                torch.manual_seed(0)  # the random actions
                out.append(env.rollout(120, break_when_any_done=False))
            a, b = out
            assert set(a.keys(True, True)) == set(b.keys(True, True))
            assert (a == b).all(), "rollouts differ"
            assert a["next", "done"].sum() > 4  # episodes ended and were reset within the rollout
        finally:
            ours.close()
            ref.close()

    def test_collector_equals_torchrl_over_sync_vector_env(self):
        ours, ref = self._pair("Disabled")
        try:
            batches = []
            for env in (ours, ref):
                env.set_seed(3)
                torch.manual_seed(1)
                collector = TorchRLCollector(env, policy=None, frames_per_batch=80, total_frames=240)
                batches.append([b.clone() for b in collector])
                collector.shutdown(close_env=False)
            assert len(batches[0]) == len(batches[1]) == 3
            for a, b in zip(*batches):
                assert (a.exclude("collector") == b.exclude("collector")).all()
            assert sum(int(b["next", "done"].sum()) for b in batches[0]) > 4
        finally:
            ours.close()
            ref.close()

    def test_next_step_is_refused_before_any_worker_starts(self):
        from shmvec.integrations.torchrl import make_torchrl_env

        with pytest.raises(ValueError, match="Disabled or SameStep"):
            make_torchrl_env("CartPole-v1", 2, autoreset_mode="NextStep")


class TestGymnasiumRegistry:
    """``register_shm`` gives an id a vector_entry_point: gymnasium.make_vec builds a ShmVectorEnv."""

    @staticmethod
    def _same_steps(ours, ref, steps: int = 60, seed: int = 5) -> int:
        assert_same(ours.reset(seed=seed), ref.reset(seed=seed), "reset")
        rng = np.random.default_rng(0)
        ended = 0
        for t in range(steps):
            actions = rng.integers(0, 2, size=ours.num_envs)
            got, want = ours.step(actions), ref.step(actions)
            assert_same(got, want, f"step {t}")
            ended += int((got[2] | got[3]).sum())
        return ended

    def test_new_id_with_options_equals_sync_vector_env(self):
        from shmvec.integrations.gymnasium_registry import register_shm

        new_id = register_shm("CartPole-v1", new_id="shmvec_test/CartPole-v1", n_workers=2)
        try:
            assert new_id == "shmvec_test/CartPole-v1"
            ours = gym.make_vec(new_id, 4, vectorization_mode="vector_entry_point", max_episode_steps=20)
            ref = gym.make_vec("CartPole-v1", 4, vectorization_mode="sync", max_episode_steps=20)
            try:
                assert isinstance(ours, ShmVectorEnv) and ours.n_workers == 2
                assert ours.spec.id == new_id and ours.spec.kwargs["vectorization_mode"] == "vector_entry_point"
                assert self._same_steps(ours, ref) > 0  # truncated at 20 steps (the keyword reached each env)
            finally:
                ours.close()
                ref.close()
            # Gymnasium's own modes still give its own vector envs; options for one call in shmvec_options
            sync = gym.make_vec(new_id, 2, vectorization_mode="sync")
            assert isinstance(sync, SyncVectorEnv)
            sync.close()
            same_step = gym.make_vec(new_id, 2, shmvec_options={"autoreset_mode": "SameStep", "n_workers": 1})
            try:
                assert isinstance(same_step, ShmVectorEnv)
                assert same_step.autoreset_mode == AutoresetMode.SAME_STEP and same_step.n_workers == 1
            finally:
                same_step.close()
        finally:
            del gym.registry[new_id]

    @pytest.mark.parametrize("start_method", ["fork", "spawn"])
    def test_registering_in_place_makes_it_make_vecs_default(self, start_method):
        from shmvec.integrations.gymnasium_registry import register_shm

        env_id = "ShmvecRegistered-v0"
        before = gym.registry[env_id]
        try:
            assert register_shm(env_id, start_method=start_method, n_workers=2) == env_id
            ours = gym.make_vec(env_id, 3)  # vectorization_mode left out: the spec's entry point
            ref = gym.make_vec(env_id, 3, vectorization_mode="sync")
            try:
                assert isinstance(ours, ShmVectorEnv) and isinstance(ref, SyncVectorEnv)
                assert self._same_steps(ours, ref, steps=70) > 0  # max_episode_steps=50 of the registration
            finally:
                ours.close()
                ref.close()
            single = gym.make(env_id)  # gymnasium.make is unchanged
            assert single.spec.max_episode_steps == 50
            single.close()
        finally:
            gym.registry[env_id] = before

    def test_unknown_id_and_taken_new_id_are_refused(self):
        from shmvec.integrations.gymnasium_registry import register_shm

        with pytest.raises(gym.error.Error):
            register_shm("NoSuchEnv-v9")
        with pytest.raises(gym.error.Error, match="registered already"):
            register_shm("CartPole-v1", new_id="Pendulum-v1")


@pytest.mark.skipif(not HAVE_RL_ZOO, reason=NOT_INSTALLED.format("rl_zoo3"))
class TestRLZoo:
    def test_train_and_enjoy_run_on_shm_vec_env(self, tmp_path):
        probe = tmp_path / "probe.txt"
        env = dict(os.environ, PYTHONPATH=pythonpath(TESTS_DIR), SHMVEC_ZOO_PROBE=str(probe))
        common = ["--algo", "ppo", "--env", "CartPole-v1", "-f", str(tmp_path / "logs"), "--seed", "1",
                  "--gym-packages", "shmvec.integrations.rl_zoo", "zoo_probe"]

        def run(module: str, *args: str) -> str:
            proc = subprocess.run([sys.executable, "-m", module, *common, *args], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=150)
            assert proc.returncode == 0, f"{module} exited with {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            return proc.stdout

        out = run("rl_zoo3.train", "-n", "512")  # PPO's CartPole hyperparameters: 8 envs x 32 steps, 2 updates
        assert "Using 8 environments" in out and "total_timesteps      | 512" in out
        assert "Vec env: shmvec.ShmVecEnv (set by --gym-packages shmvec.integrations.rl_zoo; --vec-env dummy is " \
               "not used)" in out, out
        import yaml  # the zoo's own dependency; its args.yml holds an OrderedDict, as the zoo reads it back

        saved = yaml.load((tmp_path / "logs" / "ppo" / "CartPole-v1_1" / "CartPole-v1" / "args.yml").read_text(),
                          Loader=yaml.UnsafeLoader)
        assert saved["vec_env_cls"] == "shmvec.ShmVecEnv" and saved["vec_env"] == "dummy", saved
        built = probe.read_text().splitlines()
        assert "ShmVecEnv 8" in built  # the training envs (the evaluation envs too are ShmVecEnvs)
        assert (tmp_path / "logs" / "ppo" / "CartPole-v1_1" / "CartPole-v1.zip").exists()
        probe.unlink()
        out = run("rl_zoo3.enjoy", "--exp-id", "1", "-n", "100", "--no-render")
        assert "Mean reward" in out or "Episode Reward" in out
        assert probe.read_text().splitlines() == ["ShmVecEnv 1"]


@pytest.mark.skipif(tianshou is None, reason=NOT_INSTALLED.format("tianshou"))
class TestTianshou:
    @staticmethod
    def _collect(venv, seed: int):
        venv.seed(seed)
        collector = TianshouCollector(ObsHashPolicy(action_space=gym.spaces.Discrete(2)), venv,
                                      VectorReplayBuffer(4000, len(venv)))
        collector.reset()
        by_step = collector.collect(n_step=400)
        by_episode = collector.collect(n_episode=9)  # the envs that finished their share stop stepping
        buf = collector.buffer
        return (buf.obs[: len(buf)].copy(), buf.act[: len(buf)].copy(), buf.rew[: len(buf)].copy(),
                buf.terminated[: len(buf)].copy(), buf.truncated[: len(buf)].copy(), buf.obs_next[: len(buf)].copy(),
                by_step.returns, by_step.lens, by_episode.returns, by_episode.lens)

    @pytest.mark.parametrize("start_method", ["fork", "spawn"])
    def test_collector_n_step_and_n_episode_equal_dummy_vector_env(self, start_method):
        from shmvec.integrations.tianshou import ShmTianshouVectorEnv

        fns = [make_env("CartPole-v1")] * 4
        ref = DummyVectorEnv(fns)
        ours = ShmTianshouVectorEnv(fns, n_workers=2, start_method=start_method)
        try:
            assert len(ours) == ours.env_num == 4 and not ours.is_async
            got, want = self._collect(ours, 3), self._collect(ref, 3)
            names = ["obs", "act", "rew", "terminated", "truncated", "obs_next", "n_step returns", "n_step lens",
                     "n_episode returns", "n_episode lens"]
            for name, a, b in zip(names, got, want):
                assert_same(a, b, name)
            assert len(got[6]) > 4 and len(got[8]) == 9  # episodes ended in both collections
        finally:
            ours.close()
            ref.close()

    def test_subsets_step_and_reset_as_dummy_vector_env(self):
        from shmvec.integrations.tianshou import ShmTianshouVectorEnv

        fns = [make_env("CartPole-v1")] * 3
        ref = DummyVectorEnv(fns)
        ours = ShmTianshouVectorEnv(fns, n_workers=2)
        try:
            for venv in (ref, ours):
                venv.seed([10, 11, 12])
                venv.reset()
            ended = 0
            for t in range(120):
                ids = [2, 0] if t % 3 else [1]
                actions = np.array([(t + i) % 2 for i in ids])
                got, want = ours.step(actions, ids), ref.step(actions, ids)
                assert_same(got[:4], want[:4], f"step {t}")
                assert [d["env_id"] for d in got[4]] == ids
                assert [dict(d) for d in got[4]] == [dict(d) for d in want[4]]
                done = np.flatnonzero(got[2] | got[3])
                if done.size:
                    ended += done.size
                    done_ids = [ids[k] for k in done]
                    assert_same(ours.reset(done_ids)[0], ref.reset(done_ids)[0], f"reset after step {t}")
            assert ended > 3
            with pytest.raises(ShmVecEnvError, match="did not end"):
                ours.reset([0])
            assert len(ours.action_space) == 3 and ours.get_env_attr("spec", [1])[0].id == "CartPole-v1"
        finally:
            ours.close()
            ref.close()
        ours.close()  # twice is fine


class TestCleanRL:
    """CleanRL's ``gym.make_vec(..., vectorization_mode="async")`` becomes ``shmvec.make_vec(...)``."""

    def test_async_mode_left_in_is_shmvecs_own(self):
        ours = shmvec.make_vec("CartPole-v1", 4, vectorization_mode="async", vector_kwargs={"n_workers": 2})
        ref = gym.make_vec("CartPole-v1", 4, vectorization_mode="sync")
        try:
            assert isinstance(ours, ShmVectorEnv)
            assert TestGymnasiumRegistry._same_steps(ours, ref, steps=80) > 0
        finally:
            ours.close()
            ref.close()
        enum_mode = shmvec.make_vec("CartPole-v1", 2, vectorization_mode=gym.VectorizeMode.ASYNC,
                                    vector_kwargs={"n_workers": 1})
        enum_mode.close()
        for mode in ("sync", "vector_entry_point"):
            with pytest.raises(ValueError, match="call gymnasium.make_vec"):
                shmvec.make_vec("CartPole-v1", 2, vectorization_mode=mode)

    def test_autoreset_mode_is_a_plain_keyword(self):
        env = shmvec.make_vec("CartPole-v1", 2, autoreset_mode="SameStep", vector_kwargs={"n_workers": 1})
        try:
            assert env.autoreset_mode == AutoresetMode.SAME_STEP
            assert env.spec.kwargs["vector_kwargs"] == {"n_workers": 1, "autoreset_mode": "SameStep"}
        finally:
            env.close()
        same = shmvec.make_vec("CartPole-v1", 1, autoreset_mode=AutoresetMode.DISABLED,
                               vector_kwargs={"autoreset_mode": "Disabled", "n_workers": 1})
        assert same.autoreset_mode == AutoresetMode.DISABLED
        same.close()
        with pytest.raises(ValueError, match="differ"):
            shmvec.make_vec("CartPole-v1", 1, autoreset_mode="SameStep", vector_kwargs={"autoreset_mode": "NextStep"})
