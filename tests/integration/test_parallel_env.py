"""ShmParallelEnv: PettingZoo's ParallelEnv API batched over envs, step for step against a plain loop.

The reference is ``test_multi_agent.LoopReference`` (a plain loop over the same ParallelEnvs with the
documented black-death semantics, answering in SB3 rows); its rows are read back per agent here:
row ``e * n_agents + k`` is agent ``k`` of env ``e``.  MPE's ``simple_spread_v3`` (mpe2) and
``tests/agentenvs.DyingAgents`` (agents that die at different times, one born late), fork and spawn.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

pytest.importorskip("pettingzoo", reason="ShmParallelEnv needs pettingzoo (pip install 'shmvec[multiagent]')")

import agentenvs  # noqa: E402
from test_multi_agent import LoopReference  # noqa: E402

from shmvec import (  # noqa: E402
    BrokenVecEnvError,
    ClosedVecEnvError,
    ShmParallelEnv,
    SpaceError,
    WorkerDiedError,
    WorkerRestartWarning,
)

START_METHODS = ["fork", "spawn"]
SEED = 7


def _spread(max_cycles: int = 9):
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=3, max_cycles=max_cycles)


def _check_reset(env, ref, obs, infos, n_agents):
    r_obs = ref.reset(SEED)
    for k, agent in enumerate(env.possible_agents):
        np.testing.assert_array_equal(obs[agent], r_obs[k::n_agents])
        for e in range(env.num_envs):
            for key, value in ref.reset_infos[e * n_agents + k].items():
                assert infos[agent]["_" + key][e] and infos[agent][key][e] == value, (agent, e, key)


def _check_step(env, ref, actions, t):
    """One step of both; returns (masked agent-steps, agents that ended early, env ends)."""
    n = env.n_agents
    obs, rew, term, trunc, infos = env.step({a: actions[k::n] for k, a in enumerate(env.possible_agents)})
    r_obs, r_rew, r_dones, r_infos = ref.step(actions)
    masked = early = 0
    for k, agent in enumerate(env.possible_agents):
        msg = f"step {t} agent {agent}"
        assert obs[agent].shape == (env.num_envs, *env.single_observation_space(agent).shape)
        assert rew[agent].shape == term[agent].shape == (env.num_envs,) and term[agent].dtype == bool
        np.testing.assert_array_equal(obs[agent], r_obs[k::n], err_msg=msg)
        np.testing.assert_array_equal(rew[agent], r_rew[k::n], err_msg=msg)
        np.testing.assert_array_equal(term[agent] | trunc[agent], r_dones[k::n], err_msg=msg)
        info = infos[agent]
        for e in range(env.num_envs):
            ref_info = r_infos[e * n + k]
            assert bool(info["active"][e]) == ref_info.get("active", True), (msg, e)
            if not info["active"][e]:
                masked += 1
                assert rew[agent][e] == 0.0 and (r_dones[e * n] or not obs[agent][e].any())
            for key in ("agent_terminated", "agent_truncated"):
                assert bool(info.get(key, np.zeros(env.num_envs))[e]) == (key in ref_info), (msg, e, key)
            early += "agent_terminated" in ref_info or "agent_truncated" in ref_info
            if "terminal_observation" in ref_info:
                assert info["_final_obs"][e]
                np.testing.assert_array_equal(info["final_obs"][e], ref_info["terminal_observation"], err_msg=msg)
                assert bool(trunc[agent][e]) == ref_info["TimeLimit.truncated"], (msg, e)
                for key, value in ref.reset_infos[e * n + k].items():
                    assert info["reset_info"][key][e] == value, (msg, e, key)
            else:
                assert "_final_obs" not in info or not info["_final_obs"][e]
            for key, value in ref_info.items():  # the env's own infos
                if key not in ("active", "agent_terminated", "agent_truncated", "terminal_observation",
                               "TimeLimit.truncated"):
                    assert info["_" + key][e] and info[key][e] == value, (msg, e, key)
    return masked, early, int(r_dones.sum()) // n


@pytest.mark.parametrize("start_method", START_METHODS)
def test_mpe_matches_a_plain_loop(start_method):
    pytest.importorskip("mpe2", reason="the MPE envs come from mpe2")
    n_envs, n_agents = 3, 3
    fns = [functools.partial(_spread, 9)] * n_envs
    ref = LoopReference(fns, n_agents)
    with ShmParallelEnv(fns, n_workers=2, start_method=start_method) as env:
        assert env.num_envs == 3 and env.agents == env.possible_agents == ["agent_0", "agent_1", "agent_2"]
        assert env.observation_space("agent_0").shape == (3, 18)
        assert env.action_space("agent_1") == env.action_space("agent_0") and env.action_space("agent_0").shape == (3,)
        obs, infos = env.reset(seed=SEED)
        _check_reset(env, ref, obs, infos, n_agents)
        rng = np.random.default_rng(0)
        ends = 0
        for t in range(20):  # two episodes and a bit
            ends += _check_step(env, ref, rng.integers(0, 5, size=n_envs * n_agents), t)[2]
        assert ends == 2 * n_envs
    assert env.closed
    with pytest.raises(ClosedVecEnvError):
        env.reset()


@pytest.mark.parametrize("start_method", START_METHODS)
@pytest.mark.parametrize("late_agent", [False, True], ids=["dying", "dying-and-late"])
def test_dying_agents_match_a_plain_loop(start_method, late_agent):
    n_envs, n_agents = 4, 3
    fns = [functools.partial(agentenvs.DyingAgents, n_agents, 12, 10, late_agent)] * n_envs
    ref = LoopReference(fns, n_agents)
    env = ShmParallelEnv(fns, n_workers=2, start_method=start_method)
    try:
        obs, infos = env.reset(seed=SEED)
        _check_reset(env, ref, obs, infos, n_agents)
        rng = np.random.default_rng(1)
        masked = early = ends = 0
        for t in range(40):
            m, a, d = _check_step(env, ref, rng.integers(0, 3, size=n_envs * n_agents), t)
            masked, early, ends = masked + m, early + a, ends + d
        assert masked > 0 and early > 0 and ends > 0
    finally:
        env.close()
    env.close()  # idempotent


def test_reset_seeds_options_and_bad_actions():
    fns = [functools.partial(agentenvs.DyingAgents, 2, 5, 5)] * 2
    with ShmParallelEnv(fns, n_workers=1, start_method="fork") as env:
        a, _ = env.reset(seed=[3, 4])
        b, _ = env.reset(seed=3, options={"x": 1})
        np.testing.assert_array_equal(a["agent_0"], b["agent_0"])  # 3 + e
        with pytest.raises(ValueError, match="one per env"):
            env.reset(options=[{}])
        with pytest.raises(KeyError, match="possible_agents"):
            env.step({"nobody": np.zeros(2, dtype=np.int64)})
        obs, rew, *_ = env.step({"agent_0": np.ones(2, dtype=np.int64)})  # agent_1's actions: 0
        assert set(obs) == set(rew) == {"agent_0", "agent_1"}


def test_observations_with_action_masks_come_back_with_their_masks():
    """PettingZoo's masked observations: each agent's observation and mask over envs, the masks those
    of plain envs stepped alike (every action allowed for a masked agent); allowed actions never raise."""
    fns = [functools.partial(agentenvs.MaskedAgents, "obs", 2)] * 3
    refs = [fn() for fn in fns]
    with ShmParallelEnv(fns, n_workers=2, start_method="fork") as env:
        assert env.single_observation_space("agent_0")["action_mask"].shape == (4,)
        obs, _ = env.reset(seed=SEED)
        for e, ref in enumerate(refs):
            ref.reset(seed=SEED + e)
        rng = np.random.default_rng(0)
        dead = 0
        for t in range(30):
            acts = {}
            for a in env.agents:
                mask, want = obs[a]["action_mask"], [ref.masks[a] if a in ref.masks else np.ones(4, np.int8)
                                                     for ref in refs]
                np.testing.assert_array_equal(mask, np.stack(want), err_msg=f"step {t} {a}")
                assert mask.dtype == np.int8 and obs[a]["observation"].shape == (3, 3)
                acts[a] = np.array([rng.choice(np.flatnonzero(m)) for m in mask])
            obs, _, term, trunc, infos = env.step(acts)
            for e, ref in enumerate(refs):
                ref.step({a: acts[a][e] for a in ref.agents})
                if not ref.agents:
                    ref.reset()
            dead += sum(int((~infos[a]["active"]).sum()) for a in env.agents)
        assert dead > 0


def test_masked_observations_with_masks_off_are_refused():
    with pytest.raises(SpaceError, match="hands back for Discrete actions only"):
        ShmParallelEnv([functools.partial(agentenvs.MaskedAgents, "obs")] * 2, n_workers=1, start_method="fork",
                       action_masks=False)


def test_render_state_and_calls_reach_every_env():
    """render(), state(), call(), get_attr() and set_attr() against the same calls on plain envs."""
    fns = [functools.partial(agentenvs.RenderedAgents, 2)] * 3
    refs = [fn() for fn in fns]
    with ShmParallelEnv(fns, n_workers=2, start_method="fork") as env:
        env.reset(seed=SEED)
        for e, ref in enumerate(refs):
            ref.reset(seed=SEED + e)
        assert env.render_mode == "rgb_array"
        frames = env.render()
        assert isinstance(frames, tuple) and len(frames) == 3
        for frame, ref in zip(frames, refs):
            np.testing.assert_array_equal(frame, ref.render())
        np.testing.assert_array_equal(env.state(), np.stack([ref.state() for ref in refs]))
        # The ParallelEnv's own names, not those of the wrapper that stacks its agents.
        assert env.call("observation_space", "agent_0") == (refs[0].observation_space("agent_0"),) * 3
        assert env.get_attr("max_life") == (10, 10, 10)
        env.set_attr("marker", [1, 2, 3])
        assert env.get_attr("marker") == (1, 2, 3)
        env.set_attr("marker", "same")
        assert env.call("marker") == ("same",) * 3
        with pytest.raises(ValueError, match="one entry per env"):
            env.set_attr("marker", [1, 2])
        with pytest.raises(AttributeError):
            env.get_attr("no_such_attribute")
        env.step({a: np.zeros(3, dtype=np.int64) for a in env.agents})  # still usable after an env's error


def test_real_mpe_envs_answer_calls_through_their_own_wrapper():
    """MPE's parallel_env (PettingZoo's aec_to_parallel wrapper): state() and the agents' spaces."""
    with ShmParallelEnv([_spread] * 2, n_workers=1, start_method="fork") as env:
        env.reset(seed=SEED)
        ref = _spread()
        ref.reset(seed=SEED)
        assert env.state().shape == (2, *ref.state().shape)
        np.testing.assert_array_equal(env.state()[0], ref.state())
        assert env.call("action_space", "agent_1") == (ref.action_space("agent_1"),) * 2
        ref.close()


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_failures_raise_as_for_single_agent_envs(how):
    """An env that raises: its own exception, and the env is broken; a killed worker: WorkerDiedError."""
    fns = [functools.partial(agentenvs.DyingAgents, 2), functools.partial(agentenvs.Faulty, 2, how)]
    with ShmParallelEnv(fns, n_workers=2, start_method="fork") as env:
        env.reset(seed=0)
        acts = {a: np.zeros(2, dtype=np.int64) for a in env.agents}
        env.step(acts)
        if how == "raise":
            with pytest.raises(RuntimeError, match="boom in a multi-agent step"):
                env.step(acts)
            with pytest.raises(BrokenVecEnvError):
                env.reset()
        else:
            with pytest.raises(WorkerDiedError, match="SIGKILL") as info:
                env.step(acts)
            assert info.value.worker == 1


def test_restart_reports_the_restarted_env_truncated_for_every_agent(tmp_path):
    """on_failure="restart": the env of the killed worker ends for every agent as truncated (not
    terminated), reward 0, shmvec_restarted in its infos and its last observation in final_obs."""
    fns = [functools.partial(agentenvs.Faulty, 99, "raise"),
           functools.partial(agentenvs.Faulty, 3, "kill", str(tmp_path / "killed"))]
    with ShmParallelEnv(fns, n_workers=2, start_method="fork", on_failure="restart") as env:
        env.reset(seed=0)
        acts = {a: np.ones(2, dtype=np.int64) for a in env.agents}
        for _ in range(2):
            _, _, term, trunc, _ = env.step(acts)
            assert not any(term[a].any() or trunc[a].any() for a in env.agents)
        with pytest.warns(WorkerRestartWarning):
            obs, rew, term, trunc, infos = env.step(acts)
        for a in env.agents:
            assert trunc[a].tolist() == [False, True] and not term[a].any() and rew[a][1] == 0.0
            assert "SIGKILL" in infos[a]["shmvec_restarted"][1] and infos[a]["_final_obs"].tolist() == [False, True]
            assert infos[a]["final_obs"].shape == (2, 3)
        _, _, term, trunc, _ = env.step(acts)
        assert not any(term[a].any() or trunc[a].any() for a in env.agents)
