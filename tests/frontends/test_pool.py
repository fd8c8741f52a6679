"""ShmEnvPool (EnvPool-style send/recv) and its SB3 entry point ShmVecEnvPool.

The envs finish in a random order (their step time is random), so each batch holds different
envs; yet every env's own trajectory must equal the same env run alone (a one-env
``SyncVectorEnv`` with the same autoreset mode, seed and actions).
"""

from __future__ import annotations

import functools

import time

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import poolenvs
import testenvs
from helpers import POOL_INFO_KEYS, assert_pool_matches_dummy, assert_same, close_all
from shmvec import BrokenVecEnvError, ShmVecEnvError, WorkerDiedError
from shmvec._codec import INFO_CODEC_MAGIC
from shmvec._errors import ClosedVecEnvError
from shmvec import _pool
from shmvec.env_pool import ShmEnvPool


def row_info(infos: dict, k: int) -> dict:
    """Row k of Gymnasium-style batched infos, as a plain dict (nested dicts included)."""
    out = {}
    for key, value in infos.items():
        if key.startswith("_") or key == "env_id":
            continue
        if isinstance(value, dict):
            if infos[f"_{key}"][k]:
                out[key] = row_info(value, k)
        elif infos[f"_{key}"][k]:
            out[key] = value[k]
    return out


def _row(value, k):
    if isinstance(value, dict):
        return {key: _row(v, k) for key, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_row(v, k) for v in value)
    return value[k]


def _pool_fns(obs_kind: str, n: int, mean_s: float = 0.001) -> list:
    return [functools.partial(poolenvs.make_jitter_env, obs_kind, "discrete", i, mean_s) for i in range(n)]


@pytest.mark.parametrize("method, mode, obs_kind, n_envs, batch, n_workers", [
    ("fork", AutoresetMode.NEXT_STEP, "dict", 7, 3, 2),
    ("fork", AutoresetMode.SAME_STEP, "box", 7, 3, 2),
    ("fork", AutoresetMode.NEXT_STEP, "tuple", 5, 5, 3),
    ("spawn", AutoresetMode.SAME_STEP, "dict", 4, 2, 2),
])
def test_each_env_follows_its_own_trajectory(method, mode, obs_kind, n_envs, batch, n_workers):
    fns = _pool_fns(obs_kind, n_envs)
    refs = [SyncVectorEnv([fn], autoreset_mode=mode) for fn in fns]
    pool = None
    try:
        pool = ShmEnvPool(fns, batch_size=batch, autoreset_mode=mode, n_workers=n_workers, start_method=method)
        assert pool.metadata["autoreset_mode"] == mode and pool.num_envs == n_envs
        obs, infos = pool.reset(seed=11)
        ref_first = [ref.reset(seed=11 + i) for i, ref in enumerate(refs)]
        assert infos["env_id"].shape == (batch,) and infos["env_id"].dtype == np.int64
        # each env's first row is its reset observation and info, whenever it comes back
        first_seen: set[int] = set()

        def check_reset_row(i, k, obs, infos):
            assert_same(_row(obs, k), _row(ref_first[i][0], 0), f"env {i} reset obs", strict_dtype=True)
            assert_same(row_info(infos, k), row_info(ref_first[i][1], 0), f"env {i} reset info")
            first_seen.add(i)

        for k, i in enumerate(infos["env_id"].tolist()):
            check_reset_row(i, k, obs, infos)
        rng = np.random.default_rng(0)
        steps = np.zeros(n_envs, dtype=np.int64)
        orders = set()
        ended = finals = 0
        ids = infos["env_id"]
        sent: dict[int, int] = {}  # env -> the action it is stepping with
        for t in range(60):
            actions = rng.integers(0, 3, size=len(ids))
            pool.send(actions, ids)
            sent.update(zip(ids.tolist(), actions.tolist()))
            obs, rew, term, trunc, infos = pool.recv()
            ids = infos["env_id"]
            assert len(set(ids.tolist())) == batch
            orders.add(tuple(ids.tolist()))
            for k, i in enumerate(ids.tolist()):
                if i not in sent:  # still its reset row from the first batch round
                    assert i not in first_seen
                    check_reset_row(i, k, obs, infos)
                    continue
                want = refs[i].step(np.array([sent.pop(i)]))
                steps[i] += 1
                where = f"step {t} env {i}"
                assert_same(_row(obs, k), _row(want[0], 0), f"{where} obs", strict_dtype=True)
                assert rew[k] == want[1][0] and rew.dtype == np.float64, where
                assert term[k] == want[2][0] and trunc[k] == want[3][0], where
                got_info, want_info = row_info(infos, k), row_info(want[4], 0)
                if "final_obs" in want_info:
                    finals += 1
                    assert_same(got_info.pop("final_obs"), want_info.pop("final_obs"), f"{where} final_obs")
                assert_same(got_info, want_info, f"{where} info")
                ended += int(term[k] or trunc[k])
        assert ended > 0 and (finals > 0) == (mode == AutoresetMode.SAME_STEP)
        assert (steps > 0).all()
        if batch < n_envs:
            assert len(orders) > 5  # the batches really were made of different envs
    finally:
        for ref in refs:
            ref.close()
        if pool is not None:
            pool.close()


def test_misuse_is_refused():
    pool = ShmEnvPool(_pool_fns("box", 4, 0.0), batch_size=2, n_workers=2, start_method="fork")
    try:
        with pytest.raises(ShmVecEnvError, match="reset"):
            pool.send(np.zeros(2, dtype=np.int64), [0, 1])
        obs, infos = pool.reset(seed=0)
        ids = infos["env_id"]
        others = sorted(set(range(4)) - set(ids.tolist()))  # reset left these in flight
        with pytest.raises(ValueError, match="in flight"):
            pool.send(np.zeros(2, dtype=np.int64), others)
        with pytest.raises(ValueError, match="distinct"):
            pool.send(np.zeros(2, dtype=np.int64), [ids[0], ids[0]])
        with pytest.raises(ValueError, match=r"in \[0, 4\)"):
            pool.send(np.zeros(1, dtype=np.int64), [4])
        with pytest.raises(ValueError, match="shape"):
            pool.send(np.zeros(3, dtype=np.int64), ids)
        pool.recv()  # the two left from reset
        with pytest.raises(ShmVecEnvError, match="fewer than batch_size"):
            pool.recv()
        pool.send(np.zeros(4, dtype=np.int64))  # all envs
        a = pool.recv()[4]["env_id"]
        b = pool.recv()[4]["env_id"]
        assert sorted(a.tolist() + b.tolist()) == [0, 1, 2, 3]
    finally:
        pool.close()
    with pytest.raises(ClosedVecEnvError):
        pool.recv()
    with pytest.raises(ValueError, match="batch_size"):
        ShmEnvPool(_pool_fns("box", 2), batch_size=3)
    with pytest.raises(ValueError, match="NEXT_STEP and SAME_STEP"):
        ShmEnvPool(_pool_fns("box", 2), autoreset_mode=AutoresetMode.DISABLED)


def test_rare_calls_and_reset_while_envs_are_in_flight():
    fns = [functools.partial(testenvs.make_render_env, i) for i in range(6)]
    pool = ShmEnvPool(fns, batch_size=2, n_workers=2, start_method="fork")
    try:
        _, infos = pool.reset(seed=1)
        pool.send(np.ones(2, dtype=np.int64), infos["env_id"])  # 6 in flight
        assert pool.get_attr("tag") == (0, 1, 2, 3, 4, 5)  # the pool pauses, then goes on
        pool.set_attr("scale", [0.0] * 6)
        assert pool.call("bump", 2) == (2,) * 6
        assert len(pool.render()) == 6
        seen = []
        for _ in range(3):
            obs, rew, term, trunc, infos = pool.recv()
            seen += infos["env_id"].tolist()
        assert sorted(seen) == list(range(6))
        pool.send(np.ones(2, dtype=np.int64), infos["env_id"])
        obs, rew, *_ = pool.step(np.ones(2, dtype=np.int64), [i for i in range(6) if i not in infos["env_id"]][:2])
        assert (rew == 0.0).all()  # scale 0 was set in the workers' envs
        obs, infos = pool.reset(seed=1)  # drops what was in flight
        assert sorted(infos["tag"].tolist()) == sorted(infos["env_id"].tolist())
    finally:
        pool.close()


def test_env_error_and_dead_worker():
    fns = [functools.partial(testenvs.make_raising_env, 3)] * 2 + [functools.partial(testenvs.make_raising_env, 99)] * 2
    pool = ShmEnvPool(fns, batch_size=2, n_workers=2, start_method="fork")
    try:
        pool.reset()
        pool.recv()  # the other two reset envs
        with pytest.raises(testenvs.EnvBoom):
            for _ in range(10):
                pool.send(np.zeros(4, dtype=np.int64))
                pool.recv()
                pool.recv()
        with pytest.raises(BrokenVecEnvError):
            pool.send(np.zeros(2, dtype=np.int64), [2, 3])
    finally:
        pool.close()
    pool = ShmEnvPool([functools.partial(testenvs.make_suicide_env, 2)] * 2, batch_size=1, n_workers=2,
                      start_method="fork")
    try:
        pool.reset()
        pool.recv()
        with pytest.raises(WorkerDiedError, match="died"):
            for _ in range(5):
                pool.send(np.zeros(2, dtype=np.int64))
                pool.recv()
                pool.recv()
    finally:
        pool.close()


# ---------------------------------------------------------------------------------------------
# The SB3 entry point
# ---------------------------------------------------------------------------------------------

def test_sb3_pool_with_full_batch_equals_dummy_vec_env():
    """batch_size == num_envs: synchronous, rows in env order, DummyVecEnv step for step."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmvec.vec_env_pool import ShmVecEnvPool

    fns = testenvs.spaces_env_fns("dict", "discrete", 5)
    ref = DummyVecEnv(fns)
    env = ShmVecEnvPool(fns, n_workers=2, start_method="fork")
    try:
        assert env.num_envs == 5 and env.pool_size == 5

        def in_env_order(infos):
            assert [info["env_id"] for info in infos] == [0, 1, 2, 3, 4]

        assert assert_pool_matches_dummy(env, ref, 60, 3, in_env_order) > 0
        assert env.get_attr("tag") == [0, 1, 2, 3, 4]
        assert env.env_method("bump", 3, indices=[1, 3]) == [3, 3]
        env.set_attr("scale", 2.0, indices=[0])
        assert env.get_attr("scale") == [2.0, 1.0, 1.0, 1.0, 1.0]
        assert env.env_is_wrapped(testenvs.TimeLimit) == [True] * 5
    finally:
        close_all(env, ref)


def test_sb3_pool_carries_infos_of_every_type():
    """The pool's info slots carry the info codec, or a pickle where the codec declines a value
    (an OrderedDict every fourth step); nested containers, numpy values, text and a non-string
    key arrive as DummyVecEnv's (values: the pool batches infos as Gymnasium does, into arrays)."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmvec.vec_env_pool import ShmVecEnvPool

    fns = [functools.partial(testenvs.make_mixed_info_env, i) for i in range(4)]
    ref = DummyVecEnv(fns)
    env = ShmVecEnvPool(fns, n_workers=2, start_method="fork")
    try:
        first_bytes = set()

        def both_paths(infos):
            pool = env._pool
            first_bytes.update(pool._info_slots[pool._info_len > 0, 0].tolist())

        assert assert_pool_matches_dummy(env, ref, 24, 3, both_paths) > 0
        assert first_bytes == {INFO_CODEC_MAGIC, 0x80}  # the codec and a pickle (protocol 5) both ran
    finally:
        close_all(env, ref)


def test_sb3_pool_infos_are_each_envs_own_and_options_reach_the_envs():
    """An int in one env and a float in another, arrays of different lengths, bools: each env's
    info arrives as its own (Gymnasium's batching, which the pool uses for its own face, would
    truncate the float to the int's dtype); set_options reaches every env and reset_infos are
    DummyVecEnv's, after reset() and after each autoreset."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmvec.vec_env_pool import ShmVecEnvPool

    fns = [functools.partial(testenvs.make_uneven_info_env, i) for i in range(4)]
    ref = DummyVecEnv(fns)
    env = ShmVecEnvPool(fns, n_workers=2, start_method="fork")
    try:
        assert assert_pool_matches_dummy(env, ref, 20, 3, options={"offset": 2.5}) > 0
        assert {info["offset"] for info in env.reset_infos} == {0.0}  # options are for one reset only
        options = [{"offset": float(i)} for i in range(4)]
        assert assert_pool_matches_dummy(env, ref, 5, 3, options=options) >= 0
    finally:
        close_all(env, ref)


def test_sb3_pool_rare_calls_touch_only_the_envs_in_indices():
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmvec.vec_env_pool import ShmVecEnvPool

    fns = [functools.partial(testenvs.make_spaces_env, "box", "discrete", i) for i in range(4)]
    ref = DummyVecEnv(fns)
    env = ShmVecEnvPool(fns, n_workers=2, start_method="fork")
    try:
        for venv in (ref, env):
            venv.seed(1)
            venv.reset()
            assert venv.env_method("bump", 5, indices=[0, 3]) == [5, 5]
            venv.set_attr("scale", 0.0, indices=[1])  # the outermost wrapper's attribute, as SB3's
        assert env.get_attr("counter") == ref.get_attr("counter") == [5, 0, 0, 5]
        assert env.get_attr("scale", indices=[1, 2]) == ref.get_attr("scale", indices=[1, 2])
        act = np.array([1, 0, 2, 1])
        assert_same(env.step(act)[1], ref.step(act)[1], "rewards after set_attr", strict_dtype=True)
    finally:
        close_all(env, ref)


def test_sb3_pool_rows_of_envs_not_in_the_first_batch_carry_their_reset_info():
    """batch_size < pool_size: reset() returns two of four envs; the others' first rows come from
    step_wait, with their reset info in the info (as before) and in reset_infos."""
    from shmvec.vec_env_pool import ShmVecEnvPool

    fns = [functools.partial(testenvs.make_spaces_env, "box", "discrete", i) for i in range(4)]
    env = ShmVecEnvPool(fns, batch_size=2, n_workers=2, start_method="fork")
    try:
        env.reset()
        first = {info["env_id"]: ri for info, ri in zip([{"env_id": i} for i in env._ids.tolist()], env.reset_infos)}
        assert sorted(first) in ([0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]) and all("tag" in ri for ri in first.values())
        seen = set(first)
        for _ in range(6):
            _, _, dones, infos = env.step(np.zeros(2, dtype=np.int64))
            for k, info in enumerate(infos):
                i = info["env_id"]
                if i not in seen:  # its reset row
                    assert info["tag"] == i and "pool_action" not in info
                    assert env.reset_infos[k]["tag"] == i
                    seen.add(i)
                elif not dones[k]:
                    assert env.reset_infos[k] == {}  # not another env's reset info
        assert seen == {0, 1, 2, 3}
    finally:
        env.close()


def test_sb3_pool_step_wait_resumes_after_ctrl_c():
    """Ctrl-C in step_wait (SB3's face has no recv() to resume with): the step stays in flight, and
    step_wait() again returns it, envs and all."""
    import signal

    from shmvec.vec_env_pool import ShmVecEnvPool

    fns = [functools.partial(testenvs.make_slow_spaces_env, 0.3, i) for i in range(4)]
    env = ShmVecEnvPool(fns, n_workers=2, start_method="fork")

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        env.reset()
        env.step_async(np.zeros(4, dtype=np.int64))
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(KeyboardInterrupt):
            env.step_wait()
        assert env.waiting
        obs, rewards, dones, infos = env.step_wait()
        assert sorted(info["env_id"] for info in infos) == [0, 1, 2, 3]
        env.step(np.zeros(4, dtype=np.int64))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        env.close()


def test_pool_info_too_large_for_the_codec_goes_pickled():
    """A message the codec cannot fit in the slot is pickled when the pickle fits (shared strings)."""
    fns = [functools.partial(testenvs.make_repeated_text_info_env, i) for i in range(2)]
    pool = ShmEnvPool(fns, batch_size=2, n_workers=1, start_method="fork", info_bytes=512)
    try:
        pool.reset(seed=0)
        for t in range(1, 6):
            infos = pool.step(np.zeros(2, dtype=np.int64), [0, 1])[4]
            for k in range(2):
                info = row_info(infos, k)
                assert info["names"] == [testenvs.RepeatedTextInfoEnv.NAME] * 40 and info["t"] == t
            assert pool._info_slots[:, 0].tolist() == [0x80, 0x80]  # pickled
    finally:
        pool.close()


def _transition_errors(obs, next_obs, action, reward) -> int:
    """Transitions of CounterEnv that cannot have happened (stitched from different envs)."""
    tag, t = obs[:, 0], obs[:, 1]
    ok = (next_obs[:, 0] == tag) & (next_obs[:, 1] == t + 1) & np.isclose(reward, 10 * tag + t + 0.25 * action)
    return int((~ok).sum())


@pytest.mark.parametrize("buffer", ["pool", "plain"])
def test_sb3_dqn_stores_true_transitions_only_with_pool_replay_buffer(buffer):
    from stable_baselines3 import DQN
    from stable_baselines3.common.buffers import ReplayBuffer

    from shmvec.vec_env_pool import PoolReplayBuffer, ShmVecEnvPool

    env = ShmVecEnvPool([functools.partial(poolenvs.make_counter_env, i) for i in range(8)], batch_size=3,
                        n_workers=2, start_method="fork")
    try:
        model = DQN("MlpPolicy", env, learning_starts=10_000, buffer_size=2000, seed=0, device="cpu",
                    replay_buffer_class=PoolReplayBuffer if buffer == "pool" else ReplayBuffer)
        model.learn(600)
        rb = model.replay_buffer
        n = rb.pos
        assert n > 150
        obs = rb.observations[:n].reshape(-1, 2)
        nxt = rb.next_observations[:n].reshape(-1, 2)
        act = rb.actions[:n].reshape(-1)
        rew = rb.rewards[:n].reshape(-1)
        done = rb.dones[:n].reshape(-1).astype(bool)
        errors = _transition_errors(obs, nxt, act, rew)
        if buffer == "pool":
            assert errors == 0
            assert done.sum() > 10
        else:  # SB3's row-wise pairing stitches envs together: the reason for PoolReplayBuffer
            assert errors > len(obs) // 4
    finally:
        env.close()


def test_sb3_sac_box_actions_are_stored_scaled_and_paired():
    """Box actions: PoolReplayBuffer stores each env's own action scaled to [-1, 1] as SB3 does."""
    from stable_baselines3 import SAC

    from shmvec.vec_env_pool import PoolReplayBuffer, ShmVecEnvPool

    env = ShmVecEnvPool([functools.partial(poolenvs.make_counter_env, i, 0.0005, True) for i in range(6)],
                        batch_size=2, n_workers=2, start_method="fork")
    try:
        model = SAC("MlpPolicy", env, learning_starts=10_000, buffer_size=1000, seed=0, device="cpu",
                    replay_buffer_class=PoolReplayBuffer)
        model.learn(300)
        rb = model.replay_buffer
        n = rb.pos
        assert n > 100
        scaled = rb.actions[:n].reshape(-1)
        assert np.abs(scaled).max() <= 1.0 + 1e-6 and np.abs(scaled).max() > 0.5
        errors = _transition_errors(rb.observations[:n].reshape(-1, 2), rb.next_observations[:n].reshape(-1, 2),
                                    2.0 * scaled, rb.rewards[:n].reshape(-1))
        assert errors == 0
    finally:
        env.close()


class _Alarm(Exception):
    pass


def test_interrupted_recv_loses_no_env_and_timeout_is_reported():
    import signal

    from shmvec import WorkerTimeoutError

    fns = [functools.partial(testenvs.make_sleepy_env, 0.0), functools.partial(testenvs.make_sleepy_env, 1.0)]
    pool = ShmEnvPool(fns, batch_size=2, n_workers=2, start_method="fork")

    def on_alarm(signum, frame):
        raise _Alarm()

    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        pool.reset()
        pool.send(np.zeros(2, dtype=np.int64), [0, 1])
        signal.setitimer(signal.ITIMER_REAL, 0.4)  # env 0 is back by then, env 1 sleeps 1 s
        with pytest.raises(_Alarm):
            pool.recv()
        infos = pool.recv()[4]  # the same recv goes on: env 0's result was kept
        assert sorted(infos["env_id"].tolist()) == [0, 1]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        pool.close()
    pool = ShmEnvPool([functools.partial(testenvs.make_sleepy_env, 60.0)] * 2, batch_size=1, n_workers=2,
                      start_method="fork", timeout=0.5)
    try:
        pool.reset()
        pool.recv()
        pool.send(np.zeros(2, dtype=np.int64))
        with pytest.raises(WorkerTimeoutError, match="did not finish within 0.5 s"):
            pool.recv()
    finally:
        pool.close()  # terminates the sleeping workers


def test_recv_timeout_counts_from_each_envs_send():
    """timeout=1.2 with env 0 back after 1 s and env 1 hung: recv raises 1.2 s after env 1 was
    sent (its step is what the timeout bounds), not 1.2 s after env 0 arrived (about 2.2 s in)."""
    import time

    from shmvec import WorkerTimeoutError

    fns = [functools.partial(testenvs.make_sleepy_env, 1.0), functools.partial(testenvs.make_sleepy_env, 60.0)]
    pool = ShmEnvPool(fns, batch_size=2, n_workers=2, start_method="fork", timeout=1.2)
    try:
        pool.reset()  # returns the first batch (both envs)
        t0 = time.monotonic()
        pool.send(np.zeros(2, dtype=np.int64), [0, 1])
        with pytest.raises(WorkerTimeoutError, match=r"the step of env 1 did not finish within 1.2 s of its send\(\)"):
            pool.recv()
        assert 1.15 < time.monotonic() - t0 < 2.0
    finally:
        pool.close()  # terminates the sleeping worker


def test_recv_timeout_names_the_stuck_env_and_shows_where_it_hangs():
    from shmvec import WorkerTimeoutError
    from shmvec._errors import WorkerStacks

    fns = [functools.partial(testenvs.make_sleepy_env, 0.0)] * 3 + [functools.partial(testenvs.make_sleepy_env, 60.0)]
    pool = ShmEnvPool(fns, batch_size=4, n_workers=2, start_method="fork", timeout=0.6)
    try:
        pool.reset()
        pool.send(np.zeros(4, dtype=np.int64))
        with pytest.raises(WorkerTimeoutError) as info:
            pool.recv()
        # Worker 0 is idle (its envs came back): only worker 1, in env 3, is named and asked.
        assert "env 3 did not finish within 0.6 s of its send() (sent " in str(info.value)
        assert "; worker 1, in env 3. " in str(info.value)
        stack = info.value.__cause__
        assert isinstance(stack, WorkerStacks) and "testenvs.py" in str(stack) and "in step" in str(stack)
        assert "worker 0" not in str(stack)
    finally:
        pool.close()  # terminates the sleeping worker


def test_info_larger_than_its_slot_names_the_env():
    from shmvec._pool import InfoTooLargeError

    fns = [functools.partial(testenvs.make_big_info_env, i) for i in range(2)]
    pool = ShmEnvPool(fns, batch_size=2, n_workers=1, start_method="fork", info_bytes=64)
    try:
        pool.reset()
        with pytest.raises(InfoTooLargeError, match=r"info of env \d takes \d+ bytes.*info_bytes=64"):
            for _ in range(20):
                pool.step(np.zeros(2, dtype=np.int64), [0, 1])
    finally:
        pool.close()


class _InterruptedRows(ShmEnvPool):
    """Ctrl-C while recv() builds its batch (after the wait: a batch with many info keys takes
    a millisecond or more there)."""

    interrupt = True

    def _rows(self, engine, idx):
        if self.interrupt:
            self.interrupt = False
            raise KeyboardInterrupt
        return super()._rows(engine, idx)


def test_an_interrupt_while_recv_builds_its_batch_loses_no_env_and_no_reset_info():
    pool = _InterruptedRows(testenvs.bare_env_fns(4), batch_size=4, n_workers=2, start_method="fork")
    try:
        pool.async_reset()
        with pytest.raises(KeyboardInterrupt):
            pool.recv()
        obs, _, _, _, infos = pool.recv()  # the same batch: nothing was marked received
        assert sorted(infos["env_id"].tolist()) == [0, 1, 2, 3]
        assert infos["_tag"].all() and sorted(infos["tag"].tolist()) == [0, 1, 2, 3]  # the reset infos too
        pool.send(np.zeros(4, dtype=np.int64))
        pool.interrupt = True
        with pytest.raises(KeyboardInterrupt):
            pool.recv()
        assert sorted(pool.recv()[4]["env_id"].tolist()) == [0, 1, 2, 3]
    finally:
        pool.close()


@pytest.mark.parametrize("env_ids, match", [([0.7, 1.9], "must be integers"), (["1"], "must be integers"),
                                            ([False, True, True, False], "must be integers"),
                                            ([[1], [3]], "must be a 1-D sequence")])
def test_send_refuses_env_ids_that_are_not_integers(env_ids, match):
    pool = ShmEnvPool([functools.partial(testenvs.make_sleepy_env, 0.0) for _ in range(4)], batch_size=2,
                      n_workers=2, start_method="fork")
    try:
        pool.async_reset()
        pool.recv()
        pool.recv()
        with pytest.raises(ValueError, match=f"env_ids {match}"):
            pool.send(np.zeros(len(env_ids), dtype=np.int64), env_ids)
        pool.send(np.zeros(2, dtype=np.int64), np.array([1, 3], dtype=np.int32))  # any integer dtype
        assert sorted(pool.recv()[4]["env_id"].tolist()) == [1, 3]
    finally:
        pool.close()


def test_info_bytes_must_be_positive():
    with pytest.raises(ValueError, match="info_bytes"):
        ShmEnvPool([functools.partial(testenvs.make_sleepy_env, 0.0)] * 2, info_bytes=0, start_method="fork")


def test_a_stop_interrupted_half_way_breaks_the_pool_and_close_still_stops_every_worker():
    """A rare call stops the pool: STOP reached worker 0, then Ctrl-C. The pool is broken (it
    said it was stopped while worker 1 served it: a retried call hung) and close() stops worker
    1 too, at once and politely (it ignored CLOSE, and close() terminated it after 5 s)."""
    import time

    pool = ShmEnvPool(testenvs.bare_env_fns(4), batch_size=4, n_workers=2, start_method="fork", timeout=30.0)
    try:
        pool.async_reset()
        pool.recv()
        queues = pool._in_qs

        def stop_one_then_interrupt():
            queues[0].push(_pool.STOP)
            raise KeyboardInterrupt

        pool._stop_workers = stop_one_then_interrupt
        with pytest.raises(KeyboardInterrupt):
            pool.call("tag")
        del pool._stop_workers
        with pytest.raises(BrokenVecEnvError):
            pool.call("tag")
        start = time.monotonic()
        pool.close()
        assert time.monotonic() - start < 3.0  # a worker deaf to CLOSE is terminated only after 5 s
    finally:
        pool.close()


def test_sb3_pool_step_interrupted_as_send_returns_or_while_step_wait_builds_rows_loses_nothing():
    """Ctrl-C once the envs are sent (step_async had not yet noted it: the envs stayed in flight for
    ever) or once recv() returned the batch (step_wait dropped it): step_wait() returns the step."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmvec.vec_env_pool import ShmVecEnvPool

    fns = testenvs.spaces_env_fns("box", "discrete", 4)
    ref, env = DummyVecEnv(fns), ShmVecEnvPool(fns, n_workers=2, start_method="fork", timeout=30.0)
    try:
        ref.seed(2)
        env.seed(2)
        assert_same(env.reset(), ref.reset(), "reset")
        pool = env._pool
        send = pool.send
        rng = np.random.default_rng(1)
        for t in range(10):
            act = rng.integers(0, 3, size=4)
            if t in (2, 6):
                def sent_then_interrupted(*args, **kwargs):
                    del pool.send
                    send(*args, **kwargs)
                    raise KeyboardInterrupt

                pool.send = sent_then_interrupted
                with pytest.raises(KeyboardInterrupt):
                    env.step_async(act)
                assert env.waiting
            else:
                env.step_async(act)
            if t in (3, 6):
                def interrupted(*args):
                    del env._sorted
                    raise KeyboardInterrupt

                env._sorted = interrupted
                with pytest.raises(KeyboardInterrupt):
                    env.step_wait()
                assert env.waiting
            got = env.step_wait()
            assert_same(got, ref.step(act), f"step {t}", ignore=POOL_INFO_KEYS)
            assert all(info["pool_action"] == a for info, a in zip(got[3], act))
    finally:
        close_all(env, ref)


def test_send_refuses_invalid_actions_naming_the_env_ids_and_sends_nothing():
    """As ShmVecEnv (invalid_actions="raise"): an out-of-range Discrete action is refused before
    anything is sent (it reached the env), naming the env id, not the row."""
    from shmvec import InvalidActionError

    pool = ShmEnvPool(testenvs.bare_env_fns(4), batch_size=2, n_workers=2, start_method="fork", timeout=30.0)
    try:
        pool.async_reset()
        _, _, _, _, infos = pool.recv()
        ids = np.sort(np.setdiff1d(np.arange(4), np.flatnonzero(pool._in_flight)))  # the two received
        with pytest.raises(InvalidActionError, match=f"env ids \\[{ids[1]}\\]") as info:
            pool.send(np.array([0, 3]), ids)  # Discrete(3): row 1 is out of range
        assert info.value.env_indices == [int(ids[1])]
        assert not pool._in_flight[ids].any()  # nothing sent: the same ids go again
        pool.send(np.array([0, 2]), ids)
        assert len(pool.recv()[4]["env_id"]) == 2
    finally:
        pool.close()


def test_sb3_pool_step_async_refused_because_its_envs_are_in_flight_sends_nothing():
    """reset() interrupted in its recv(): every env is in flight. step_async() is refused (nothing
    sent) and must not claim a step in flight: reset() works again, and no action is recorded."""
    from shmvec.vec_env_pool import ShmVecEnvPool

    env = ShmVecEnvPool(testenvs.spaces_env_fns("box", "discrete", 4), batch_size=2, n_workers=1,
                        start_method="fork", timeout=30.0)
    try:
        env.reset()
        env.step(np.array([0, 1]))
        pool = env._pool
        recv = pool.recv

        def interrupted():
            del pool.recv
            raise KeyboardInterrupt

        pool.recv = interrupted
        with pytest.raises(KeyboardInterrupt):
            env.reset()
        with pytest.raises(ValueError, match="in flight already"):
            env.step_async(np.array([2, 2]))
        assert not env.waiting and env._last_action == {}
        env.reset()
        actions = [info["pool_action"] for _ in range(3) for info in env.step(np.array([1, 1]))[3]
                   if "pool_action" in info]
        assert actions and all(a == 1 for a in actions)  # never the refused [2, 2]
        del recv
    finally:
        env.close()



def test_a_pool_collected_from_a_reference_cycle_closes_its_workers_politely_and_quickly():
    """Never closed, collected by the garbage collector: the engine's finalizer posts CLOSE, which
    a worker serving the pool did not see (it waited for a STOP): 5 s, then SIGTERM, and its
    envs' close() never ran."""
    import gc

    pool = ShmEnvPool(testenvs.bare_env_fns(4), batch_size=2, n_workers=2, start_method="fork", timeout=30.0)
    pool.reset(seed=0)
    pool.send(np.zeros(2, dtype=np.int64), np.array([0, 1]))  # running, envs in flight
    pool.cycle = pool  # only the collector frees it
    del pool
    start = time.monotonic()
    gc.collect()
    took = time.monotonic() - start
    assert took < 2.5, took  # it was 5 s (then SIGTERM); the leak check sees that no worker stays


def test_sb3_pool_reset_refused_for_its_seeds_keeps_the_step_in_flight():
    import gymnasium as gym

    from shmvec.vec_env_pool import ShmVecEnvPool

    env = ShmVecEnvPool(testenvs.bare_env_fns(2), n_workers=2, start_method="fork", timeout=30.0)
    try:
        env.reset()
        env.step_async(np.zeros(2, dtype=np.int64))
        env.seed(-3)
        with pytest.raises(gym.error.Error, match="Seed must be"):
            env.reset()
        assert env.waiting
        assert len(env.step_wait()[0]) == 2  # was NoAsyncCallError, and the envs stayed in flight
    finally:
        env.close()


@pytest.mark.timeout(60, method="thread")  # pytest-timeout's own method uses SIGALRM
@pytest.mark.parametrize("in_flight", [True, False])
def test_a_broken_sb3_pool_says_so_on_every_call(in_flight):
    """Broken by a Ctrl-C while its workers reset: step() and step_async() said to call step_wait()
    or reset() (both broken), and step_wait() with nothing in flight raised NoAsyncCallError."""
    import signal

    from shmvec import BrokenVecEnvError
    from shmvec.vec_env_pool import ShmVecEnvPool

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    fns = [functools.partial(testenvs.make_sleepy_env, 0.0, 0.3) for _ in range(4)]  # reset() sleeps 0.3 s
    env = ShmVecEnvPool(fns, n_workers=2, start_method="fork", timeout=30.0)
    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        env.reset()
        actions = np.zeros(4, dtype=np.int64)
        if in_flight:
            env.step_async(actions)
        signal.setitimer(signal.ITIMER_REAL, 0.1)  # lands while the workers run RESET
        with pytest.raises(KeyboardInterrupt):
            env.reset()
        signal.setitimer(signal.ITIMER_REAL, 0)
        assert env._pool._engine.status.failure is not None
        for call in (lambda: env.step(actions), lambda: env.step_async(actions), env.step_wait, env.reset):
            with pytest.raises(BrokenVecEnvError):
                call()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        env.close()


@pytest.mark.parametrize("mode, n, batch", [(AutoresetMode.NEXT_STEP, 5, 5), (AutoresetMode.SAME_STEP, 4, 2)])
def test_step_envs_steps_exactly_the_ids_given_and_returns_them_in_their_order(mode, n, batch):
    """step_envs(actions, ids): those envs alone step, and come back in the order of ids, whatever
    batch_size is (EnvPool's synchronous step); each env's rows equal it run alone."""
    fns = _pool_fns("box", n, mean_s=0.0005)
    refs = [SyncVectorEnv([fn], autoreset_mode=mode) for fn in fns]
    pool = None
    try:
        pool = ShmEnvPool(fns, batch_size=batch, autoreset_mode=mode, n_workers=2, start_method="fork")
        for i, ref in enumerate(refs):
            ref.reset(seed=3 + i)
        pool.async_reset(seed=3)
        with pytest.raises(ShmVecEnvError, match=r"envs \[0, 1, 2, 3.*\] in flight"):  # reset rows not received
            pool.step_envs(np.zeros(1, dtype=np.int64), [0])
        while pool._in_flight.any():
            pool.recv()
        rng = np.random.default_rng(1)
        ended = 0
        for t in range(80):
            ids = rng.permutation(n)[: rng.integers(1, n + 1)]
            actions = rng.integers(0, 3, size=ids.size)
            obs, rew, term, trunc, infos = pool.step_envs(actions, ids)
            assert infos["env_id"].tolist() == ids.tolist()
            for k, i in enumerate(ids.tolist()):
                want = refs[i].step(actions[k:k + 1])
                assert_same(obs[k], want[0][0], f"step {t} env {i} obs", strict_dtype=True)
                assert (rew[k], term[k], trunc[k]) == (want[1][0], want[2][0], want[3][0]), f"step {t} env {i}"
                got_info, want_info = row_info(infos, k), row_info(want[4], 0)
                if "final_obs" in want_info:
                    assert_same(got_info.pop("final_obs"), want_info.pop("final_obs"), f"step {t} env {i} final_obs")
                assert_same(got_info, want_info, f"step {t} env {i} info")
                ended += int(term[k] or trunc[k])
        assert ended > 0
        pool.send(np.zeros(1, dtype=np.int64), [3])
        with pytest.raises(ShmVecEnvError, match=r"envs \[3\] in flight"):
            pool.step_envs(np.zeros(1, dtype=np.int64), [0])
    finally:
        for ref in refs:
            ref.close()
        if pool is not None:
            pool.close()
