"""ShmMultiAgentVecEnv: PettingZoo ParallelEnvs, one SB3 row per agent, step for step against references.

- MPE's ``simple_spread_v3`` (mpe2) against SuperSuit's own path,
  ``concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(env), n, num_cpus=0, base_class="stable_baselines3")``,
  on the same seeds: observations, rewards, dones and terminal observations, across episode ends;
- ``tests/agentenvs.DyingAgents`` (agents that die at different times, one born late) against a
  plain loop over the same ParallelEnvs written here with the documented semantics (SuperSuit's
  black death wrapper cannot serve as the reference: it ends an env only when every agent is both
  terminated and truncated); infos, reset infos and the ``active`` flags too;
- both under every start method; then PPO, the spaces-differ error and ``pad=True``, AEC envs.
"""

from __future__ import annotations

import functools
import multiprocessing

import numpy as np
import pytest

pytest.importorskip("pettingzoo", reason="ShmMultiAgentVecEnv needs pettingzoo (pip install 'shmvec[multiagent]')")

import agentenvs  # noqa: E402
from helpers import close_all  # noqa: E402
from shmvec import (  # noqa: E402
    BrokenVecEnvError,
    ShmMultiAgentVecEnv,
    SpaceError,
    WorkerDiedError,
    WorkerRestartWarning,
)

START_METHODS = [m for m in ("fork", "forkserver", "spawn") if m in multiprocessing.get_all_start_methods()]
SEED = 7


def _spread(max_cycles: int = 9):
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=3, max_cycles=max_cycles)


def _kaz():
    """Butterfly's knights_archers_zombies with zombies spawned every step: its four agents are killed at
    different steps (about the 100th to the 140th), long before max_cycles."""
    from pettingzoo.butterfly import knights_archers_zombies_v11

    return knights_archers_zombies_v11.parallel_env(spawn_delay=1, max_zombies=30, max_cycles=600)


def _spread_aec(max_cycles: int = 9):
    from mpe2 import simple_spread_v3

    return simple_spread_v3.env(N=3, max_cycles=max_cycles)


class LoopReference:
    """A plain loop over the ParallelEnvs with the semantics ShmMultiAgentVecEnv documents."""

    def __init__(self, env_fns, n_agents):
        self.envs = [fn() for fn in env_fns]
        self.agents = list(self.envs[0].possible_agents)
        self.n = n_agents
        self.space = self.envs[0].observation_space(self.agents[0])

    def _rows(self, obs, rews=None, terms=None, truncs=None, infos=None):
        n = self.n
        o = np.zeros((n, *self.space.shape), self.space.dtype)
        r, t, tr = np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool)
        info = [{} for _ in range(n)]
        for k, a in enumerate(self.agents):
            if a in obs:
                o[k] = obs[a]
                if rews is not None:
                    r[k], t[k], tr[k] = rews[a], terms[a], truncs[a]
            else:
                info[k]["active"] = False
            if infos and infos.get(a):
                info[k] = {**infos[a], **info[k]}
        return o, r, t, tr, info

    def reset(self, seed):
        out, self.reset_infos = [], []
        for e, env in enumerate(self.envs):
            obs, infos = env.reset(seed=seed + e)
            o, _, _, _, _ = self._rows(obs)
            out.append(o)
            self.reset_infos += [dict(infos.get(a) or {}) for a in self.agents]
        return np.concatenate(out)

    def step(self, actions):
        actions = actions.reshape(len(self.envs), self.n)
        all_obs, all_rew, all_done, all_infos = [], [], [], []
        for e, env in enumerate(self.envs):
            acts = {a: actions[e, self.agents.index(a)] for a in env.agents}
            obs, rews, terms, truncs, infos = env.step(acts)
            o, r, t, tr, info = self._rows(obs, rews, terms, truncs, infos)
            ended = not [a for a in env.agents if not (terms.get(a) or truncs.get(a))]
            for k in range(self.n):
                if (t[k] or tr[k]) and not ended:
                    info[k]["agent_terminated" if t[k] else "agent_truncated"] = True
            rinfo = [{} for _ in range(self.n)]
            if ended:
                for k in range(self.n):
                    info[k]["terminal_observation"] = o[k]
                    info[k]["TimeLimit.truncated"] = bool(tr[k] and not t[k])
                obs, infos = env.reset()
                o, _, _, _, _ = self._rows(obs)
                rinfo = [dict(infos.get(a) or {}) for a in self.agents]
            for k in range(self.n):
                if ended:
                    self.reset_infos[e * self.n + k] = rinfo[k]
            all_obs.append(o)
            all_rew.append(r)
            all_done.append(np.full(self.n, ended))
            all_infos += info
        return np.concatenate(all_obs), np.concatenate(all_rew), np.concatenate(all_done), all_infos


def _assert_infos(infos, ref_infos, t):
    assert len(infos) == len(ref_infos)
    for row, (a, b) in enumerate(zip(infos, ref_infos)):
        assert set(a) == set(b), (t, row, a, b)
        for key in a:
            if key == "terminal_observation":
                np.testing.assert_array_equal(a[key], b[key], err_msg=f"step {t} row {row}")
            else:
                assert a[key] == b[key], (t, row, key)


@pytest.mark.parametrize("start_method", START_METHODS)
def test_mpe_matches_supersuit(start_method):
    ss = pytest.importorskip("supersuit", reason="the reference is SuperSuit's vec env")
    pytest.importorskip("mpe2", reason="the MPE envs come from mpe2")
    n_envs = 3
    fn = functools.partial(_spread, 9)
    venv = ShmMultiAgentVecEnv([fn] * n_envs, n_workers=2, start_method=start_method)
    ref = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(fn()), n_envs, num_cpus=0,
                                base_class="stable_baselines3")
    try:
        assert venv.num_envs == ref.num_envs == 9
        assert venv.observation_space == ref.observation_space and venv.action_space == ref.action_space
        assert venv.possible_agents == ["agent_0", "agent_1", "agent_2"]
        venv.seed(SEED)
        obs = venv.reset()
        ref_obs, _ = ref.venv.reset(seed=SEED)  # (SuperSuit's SB3 wrapper has no seed())
        np.testing.assert_array_equal(obs, ref_obs)
        rng = np.random.default_rng(0)
        ends = 0
        for t in range(30):  # three episodes and a bit
            actions = rng.integers(0, 5, size=venv.num_envs)
            obs, rew, dones, infos = venv.step(actions)
            r_obs, r_rew, r_dones, r_infos = ref.step(actions)
            np.testing.assert_array_equal(obs, r_obs, err_msg=f"step {t}")
            np.testing.assert_array_equal(rew, r_rew, err_msg=f"step {t}")
            assert rew.dtype == np.float32 and dones.dtype == bool
            np.testing.assert_array_equal(dones, r_dones, err_msg=f"step {t}")
            for row, (a, b) in enumerate(zip(infos, r_infos)):
                assert ("terminal_observation" in a) == ("terminal_observation" in b), (t, row)
                if "terminal_observation" in b:
                    np.testing.assert_array_equal(a["terminal_observation"], b["terminal_observation"])
                    assert a["TimeLimit.truncated"] is True
            ends += int(dones.all())
        assert ends == 3
    finally:
        close_all(venv, ref)


@pytest.mark.parametrize("start_method", START_METHODS)
@pytest.mark.parametrize("late_agent", [False, True], ids=["dying", "dying-and-late"])
def test_dying_agents_match_a_plain_loop(start_method, late_agent):
    n_envs, n_agents = 4, 3
    fns = [functools.partial(agentenvs.DyingAgents, n_agents, 12, 10, late_agent)] * n_envs
    venv = ShmMultiAgentVecEnv(fns, n_workers=2, start_method=start_method)
    ref = LoopReference(fns, n_agents)
    try:
        venv.seed(SEED)
        np.testing.assert_array_equal(venv.reset(), ref.reset(SEED))
        assert venv.reset_infos == ref.reset_infos
        rng = np.random.default_rng(1)
        masked = ended_early = 0
        for t in range(60):
            actions = rng.integers(0, 3, size=venv.num_envs)
            obs, rew, dones, infos = venv.step(actions)
            r_obs, r_rew, r_dones, r_infos = ref.step(actions)
            np.testing.assert_array_equal(obs, r_obs, err_msg=f"step {t}")
            np.testing.assert_array_equal(rew, r_rew, err_msg=f"step {t}")
            np.testing.assert_array_equal(dones, r_dones, err_msg=f"step {t}")
            _assert_infos(infos, r_infos, t)
            assert venv.reset_infos == ref.reset_infos, t
            for row, info in enumerate(infos):
                if info.get("active") is False:  # black death: zero observation and reward
                    masked += 1
                    assert rew[row] == 0.0
                    if not dones[row]:
                        assert not obs[row].any()
                    else:
                        assert not info["terminal_observation"].any()
                ended_early += "agent_terminated" in info
            # every row of an env reports done together
            assert (dones.reshape(n_envs, n_agents).all(axis=1) == dones.reshape(n_envs, n_agents).any(axis=1)).all()
        assert masked > 0 and ended_early > 0 and dones.dtype == bool
    finally:
        close_all(venv)


@pytest.mark.parametrize("start_method", START_METHODS)
def test_butterfly_agents_that_die_early_match_a_plain_loop(start_method):
    """PettingZoo's own env with agents killed before the others (butterfly's knights_archers_zombies,
    needs ``pettingzoo[butterfly]``): step for step equal to the plain loop, across two episodes of each env."""
    pytest.importorskip("pymunk", reason="butterfly envs need pettingzoo[butterfly] (pymunk, pygame)")
    pytest.importorskip("pygame", reason="butterfly envs need pettingzoo[butterfly] (pymunk, pygame)")
    n_envs, n_agents = 2, 4
    fns = [_kaz] * n_envs
    venv = ShmMultiAgentVecEnv(fns, n_workers=2, start_method=start_method)
    ref = LoopReference(fns, n_agents)
    try:
        assert venv.possible_agents == ["archer_0", "archer_1", "knight_0", "knight_1"]
        venv.seed(SEED)
        np.testing.assert_array_equal(venv.reset(), ref.reset(SEED))
        rng = np.random.default_rng(2)
        masked = died_early = ends = 0
        for t in range(300):
            actions = rng.integers(0, 6, size=venv.num_envs)
            obs, rew, dones, infos = venv.step(actions)
            r_obs, r_rew, r_dones, r_infos = ref.step(actions)
            np.testing.assert_array_equal(obs, r_obs, err_msg=f"step {t}")
            np.testing.assert_array_equal(rew, r_rew, err_msg=f"step {t}")
            np.testing.assert_array_equal(dones, r_dones, err_msg=f"step {t}")
            _assert_infos(infos, r_infos, t)
            masked += sum(info.get("active") is False for info in infos)
            died_early += sum("agent_terminated" in info for info in infos)
            ends += int(dones.sum()) // n_agents
        assert died_early > 0 and masked > 0 and ends >= 2 * n_envs, (died_early, masked, ends)
    finally:
        close_all(venv)


def test_copy_false_and_rare_commands():
    fns = [functools.partial(agentenvs.DyingAgents, 2, 5, 5)] * 3
    venv = ShmMultiAgentVecEnv(fns, n_workers=2, start_method="fork", copy=False)
    try:
        assert venv.get_attr("max_steps") == [5] * 6
        assert venv.get_attr("possible_agents", indices=[5]) == [["agent_0", "agent_1"]]
        venv.set_attr("max_steps", 3, indices=[0, 1])  # env 0, once
        assert venv.get_attr("max_steps") == [3, 3, 5, 5, 5, 5]
        assert venv.has_attr("max_life") and not venv.has_attr("nope")
        assert venv.env_is_wrapped(object) == [False] * 6
        assert venv.render_mode is None
        venv.seed([1, 2, 3])
        obs = venv.reset()
        assert obs.shape == (6, 3) and not obs.flags.owndata
        with pytest.raises(ValueError, match="one per agent row"):
            venv.step(np.zeros(3, dtype=np.int64))
    finally:
        close_all(venv)


def test_ppo_trains_with_parameter_sharing(one_torch_thread):
    pytest.importorskip("mpe2", reason="the MPE envs come from mpe2")
    from stable_baselines3 import PPO

    venv = ShmMultiAgentVecEnv([functools.partial(_spread, 25)] * 2, n_workers=2, start_method="fork")
    try:
        model = PPO("MlpPolicy", venv, n_steps=32, batch_size=96, n_epochs=1, seed=0)
        model.learn(2 * 32 * venv.num_envs)
        assert model.num_timesteps == 2 * 32 * venv.num_envs
        assert model.ep_info_buffer is not None
    finally:
        close_all(venv)


def test_agents_with_different_spaces_are_refused_naming_them():
    with pytest.raises(SpaceError, match=r"observation spaces differ \(agent_0: .*; agent_1, agent_2: .*pad=True"):
        ShmMultiAgentVecEnv([agentenvs.MixedSpaces] * 2, n_workers=1, start_method="fork")


def test_pad_true_pads_observations_and_actions():
    venv = ShmMultiAgentVecEnv([agentenvs.MixedSpaces] * 2, n_workers=2, start_method="fork", pad=True)
    plain = [agentenvs.MixedSpaces() for _ in range(2)]
    try:
        assert venv.observation_space.shape == (3,) and venv.action_space.n == 5
        venv.seed(SEED)
        obs = venv.reset()
        for e, env in enumerate(plain):
            ref, _ = env.reset(seed=SEED + e)
            np.testing.assert_array_equal(obs[3 * e], ref["agent_0"])
            for k in (1, 2):  # zero-padded from (2,) to (3,)
                np.testing.assert_array_equal(obs[3 * e + k], np.append(ref[f"agent_{k}"], 0))
        # agent_0 has 3 actions: 4 becomes 0 (SuperSuit's dehomogenize_actions); the others keep theirs.
        actions = np.array([4, 4, 3, 1, 2, 0])
        venv.step(actions)
        seen = venv.get_attr("seen", indices=[0, 3])
        assert seen[0] == {"agent_0": 0, "agent_1": 4, "agent_2": 3}
        assert seen[1] == {"agent_0": 1, "agent_1": 2, "agent_2": 0}
    finally:
        close_all(venv)


def test_aec_env_goes_through_aec_to_parallel():
    ss = pytest.importorskip("supersuit", reason="the reference is SuperSuit's vec env")
    pytest.importorskip("mpe2", reason="the MPE envs come from mpe2")
    venv = ShmMultiAgentVecEnv([functools.partial(_spread_aec, 9)] * 2, n_workers=1, start_method="fork")
    ref = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(_spread(9)), 2, num_cpus=0,
                                base_class="stable_baselines3")
    try:
        venv.seed(SEED)
        np.testing.assert_array_equal(venv.reset(), ref.venv.reset(seed=SEED)[0])
        for t in range(12):
            actions = np.full(venv.num_envs, t % 5)
            obs, rew, dones, _ = venv.step(actions)
            r_obs, r_rew, r_dones, _ = ref.step(actions)
            np.testing.assert_array_equal(obs, r_obs)
            np.testing.assert_array_equal(rew, r_rew)
            np.testing.assert_array_equal(dones, r_dones)
    finally:
        close_all(venv, ref)


def test_aec_env_that_is_not_parallelizable_is_refused():
    with pytest.raises(TypeError, match="SerialOnlyAEC.*is_parallelizable"):
        ShmMultiAgentVecEnv([agentenvs.SerialOnlyAEC] * 2, n_workers=1, start_method="fork")


def test_a_gymnasium_env_is_refused():
    import gymnasium as gym

    with pytest.raises(TypeError, match="not a PettingZoo ParallelEnv or AECEnv.*use ShmVecEnv"):
        ShmMultiAgentVecEnv([lambda: gym.make("CartPole-v1")], n_workers=1, start_method="fork")


# ---- faults behave as for single-agent envs ---------------------------------------------------------

def test_an_env_that_raises_raises_its_own_exception():
    fns = [functools.partial(agentenvs.DyingAgents, 2), functools.partial(agentenvs.Faulty, 2, "raise")]
    venv = ShmMultiAgentVecEnv(fns, n_workers=2, start_method="fork")
    try:
        venv.reset()
        venv.step(np.zeros(venv.num_envs, dtype=np.int64))
        with pytest.raises(RuntimeError, match="boom in a multi-agent step"):
            venv.step(np.zeros(venv.num_envs, dtype=np.int64))
        with pytest.raises(BrokenVecEnvError):
            venv.reset()
    finally:
        close_all(venv)


def test_a_killed_worker_raises_worker_died_error():
    fns = [functools.partial(agentenvs.DyingAgents, 2), functools.partial(agentenvs.Faulty, 2, "kill")]
    venv = ShmMultiAgentVecEnv(fns, n_workers=2, start_method="fork")
    try:
        venv.reset()
        venv.step(np.zeros(venv.num_envs, dtype=np.int64))
        with pytest.raises(WorkerDiedError, match="SIGKILL") as info:
            venv.step(np.zeros(venv.num_envs, dtype=np.int64))
        assert info.value.worker == 1
    finally:
        close_all(venv)


def test_restart_reports_every_row_of_the_env_truncated(tmp_path):
    fns = [functools.partial(agentenvs.Faulty, 99, "raise"),
           functools.partial(agentenvs.Faulty, 3, "kill", str(tmp_path / "killed"))]
    venv = ShmMultiAgentVecEnv(fns, n_workers=2, start_method="fork", on_failure="restart")
    try:
        venv.reset()
        for _ in range(2):
            _, _, dones, _ = venv.step(np.ones(venv.num_envs, dtype=np.int64))
            assert not dones.any()
        with pytest.warns(WorkerRestartWarning):
            obs, rew, dones, infos = venv.step(np.ones(venv.num_envs, dtype=np.int64))
        assert dones.tolist() == [False, False, True, True]
        assert rew[2:].tolist() == [0.0, 0.0] and venv.restarts == 1
        assert not any("agent_truncated" in info for info in infos)
        for row in (2, 3):
            # Truncated, not terminated, as a single-agent env's restart (docs/failures.md): PPO bootstraps.
            assert "SIGKILL" in infos[row]["shmvec_restarted"] and infos[row]["TimeLimit.truncated"] is True
            assert infos[row]["terminal_observation"].shape == (3,)
        _, _, dones, _ = venv.step(np.ones(venv.num_envs, dtype=np.int64))
        assert not dones.any()
    finally:
        close_all(venv)


def _loop_masks(envs, agents, n_actions):
    """Each row's mask in a plain loop: the agent's mask where the last observations had it, else every action."""
    rows = []
    for env in envs:
        for a in agents:
            rows.append(env.masks[a].astype(bool) if a in env.masks else np.ones(n_actions, bool))
    return np.array(rows)


@pytest.mark.parametrize("mask_in", ["obs", "info"])
def test_action_masks_per_row_match_a_plain_loop(mask_in):
    """Each row's mask (from the agent's observation dict, or its info) served from shared memory,
    step for step equal to the masks of a plain loop over the same envs; dead agents allow every action."""
    n_envs, n_agents = 3, 3
    fns = [functools.partial(agentenvs.MaskedAgents, mask_in, n_agents)] * n_envs
    venv = ShmMultiAgentVecEnv(fns, n_workers=2, start_method="fork")
    envs = [fn() for fn in fns]
    try:
        assert venv.observation_space == agentenvs.DyingAgents().observation_space("agent_0")
        venv.seed(SEED)
        obs = venv.reset()
        for e, env in enumerate(envs):
            env.reset(seed=SEED + e)
        assert venv.masks_in_shm
        rng = np.random.default_rng(2)
        dead = 0
        for t in range(40):
            masks = np.array(venv.env_method("action_masks"))
            want = _loop_masks(envs, envs[0].possible_agents, 4)
            np.testing.assert_array_equal(masks, want, err_msg=f"step {t}")
            np.testing.assert_array_equal(venv.action_masks([1, 4]), want[[1, 4]])
            actions = np.array([rng.choice(np.flatnonzero(m)) for m in masks])
            obs, rew, dones, infos = venv.step(actions)
            for e, env in enumerate(envs):
                acts = {a: actions[e * n_agents + k] for k, a in enumerate(env.possible_agents) if a in env.agents}
                env.step(acts)
                if not env.agents:
                    env.reset()
            dead += int(sum(info.get("active") is False for info in infos))
        assert dead > 0
    finally:
        close_all(venv)


@pytest.mark.parametrize("mask_in", ["obs", "info"])
def test_maskable_ppo_takes_only_allowed_actions(mask_in, one_torch_thread):
    """MaskablePPO (sb3-contrib) on the masked agents: the env raises on any action its mask does not
    allow, so a run that ends took only allowed ones."""
    sb3_contrib = pytest.importorskip("sb3_contrib")
    venv = ShmMultiAgentVecEnv([functools.partial(agentenvs.MaskedAgents, mask_in)] * 4, n_workers=2,
                               start_method="fork")
    try:
        model = sb3_contrib.MaskablePPO("MlpPolicy", venv, n_steps=32, batch_size=64, n_epochs=1, seed=0)
        model.learn(3 * 32 * venv.num_envs)
        assert model.num_timesteps >= 3 * 32 * venv.num_envs
    finally:
        close_all(venv)


def test_pad_masks_the_padded_actions():
    """pad=True: an agent with fewer actions than the largest never has the padded ones allowed."""
    venv = ShmMultiAgentVecEnv([agentenvs.MixedSpaces] * 2, pad=True, n_workers=1, start_method="fork")
    try:
        venv.reset()
        masks = venv.action_masks()
        assert masks.shape == (6, 5)
        np.testing.assert_array_equal(masks[0], [True, True, True, False, False])  # agent_0: Discrete(3)
        assert masks[1].all() and masks[3][:3].all() and not masks[3][3:].any()
    finally:
        close_all(venv)


def test_zero_copy_rows_kept_by_the_caller_match_a_plain_loop():
    """zero_copy=True: the rows are views of lease blocks; every one the caller keeps (more than the
    blocks: the rest are copies) still equals the plain loop's, agents dying and envs ending included."""
    n_envs, n_agents = 3, 3
    fns = [functools.partial(agentenvs.DyingAgents, n_agents, 12, 10)] * n_envs
    venv = ShmMultiAgentVecEnv(fns, n_workers=2, start_method="fork", zero_copy=True)
    ref = LoopReference(fns, n_agents)
    try:
        venv.seed(SEED)
        kept, want = [venv.reset()], [ref.reset(SEED)]
        assert not kept[0].flags.owndata
        rng = np.random.default_rng(3)
        ends = 0
        for t in range(30):
            actions = rng.integers(0, 3, size=venv.num_envs)
            obs, rew, dones, infos = venv.step(actions)
            r_obs, r_rew, r_dones, r_infos = ref.step(actions)
            np.testing.assert_array_equal(rew, r_rew, err_msg=f"step {t}")
            _assert_infos(infos, r_infos, t)
            kept.append(obs)
            want.append(r_obs)
            ends += int(dones.sum())
        for t, (obs, r_obs) in enumerate(zip(kept, want)):
            np.testing.assert_array_equal(obs, r_obs, err_msg=f"kept rows {t}")
        assert ends > 0 and kept[-1].flags.owndata  # past the blocks: copies
    finally:
        close_all(venv)


def test_parallel_env_with_zero_copy_reads_the_block_written():
    """ShmParallelEnv copies its per-agent arrays, but with zero_copy=True passed it must read them
    from the lease block the workers wrote: equal to the same face without it."""
    from shmvec import ShmParallelEnv

    fns = [functools.partial(agentenvs.DyingAgents, 2, 12, 10)] * 2
    with ShmParallelEnv(fns, n_workers=1, start_method="fork", zero_copy=True) as a, \
            ShmParallelEnv(fns, n_workers=1, start_method="fork") as b:
        assert a._engine.leases is not None and b._engine.leases is None
        out_a, out_b = a.reset(seed=1), b.reset(seed=1)
        for t in range(20):
            acts = {agent: np.full(2, t % 3) for agent in a.agents}
            for x, y in zip(a.step(acts), b.step(acts)):
                for agent in x:
                    if isinstance(x[agent], dict):
                        assert set(x[agent]) == set(y[agent])
                    else:
                        np.testing.assert_array_equal(x[agent], y[agent], err_msg=f"step {t} {agent}")
        np.testing.assert_array_equal(out_a[0]["agent_0"], out_b[0]["agent_0"])


def test_a_vec_env_dropped_without_close_releases_everything():
    """No close(): dropping the last reference stops the workers and frees the memory (the engine's
    own finalizer; the suite's leak check sees anything left)."""
    import gc
    import weakref

    from shmvec import ShmParallelEnv

    venv = ShmMultiAgentVecEnv([functools.partial(agentenvs.DyingAgents, 2)] * 2, n_workers=2, start_method="fork")
    venv.reset()
    env = ShmParallelEnv([functools.partial(agentenvs.DyingAgents, 2)] * 2, n_workers=1, start_method="fork")
    env.reset(seed=0)
    engines = [weakref.ref(venv._engine), weakref.ref(env._engine)]
    del venv, env
    gc.collect()
    assert all(ref() is None for ref in engines)  # collected, and closed by its __del__
