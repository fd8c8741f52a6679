"""RayShmVecEnv on a real two-node Ray cluster started on this machine.

The cluster (``ray.cluster_utils.Cluster``: a head node and a second node, each with its own
raylet, so actors pinned to different nodes are different processes under different raylets)
starts once for the module.  Each test builds its own RayShmVecEnv and closes it.

Leak check: this module replaces conftest's ``no_leaks`` with a Ray-aware one.  It takes the
same snapshot (shared-memory segments, child processes, descriptors) after the cluster is up,
and fails on anything new, except what Ray itself starts and stops on its own: pooled idle
workers (``ray::IDLE``) and the driver's gRPC sockets (see ``_ray_own``).  It also fails while
any process of an actor of ours (``ray::_ShmVecActor...``) is alive, so an actor left running
is caught even when it took over a worker that existed before the test; and the tests wait
for the actors' ShmVecEnv workers to be gone.
"""

from __future__ import annotations

import functools
import os
import signal
import time

import numpy as np
import psutil
import pytest

ray = pytest.importorskip("ray")

from gymnasium.wrappers import TimeLimit  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402

import faultenvs  # noqa: E402
import testenvs  # noqa: E402
from conftest import leaks_since, take_snapshot  # noqa: E402
from helpers import TESTS_DIR, assert_pool_matches_dummy, assert_same, close_all  # noqa: E402
from shmvec import BrokenVecEnvError, ShmVecEnvError, WorkerDiedError, WorkerTimeoutError  # noqa: E402
from shmvec._errors import ClosedVecEnvError  # noqa: E402
from gymnasium.vector import AutoresetMode, SyncVectorEnv  # noqa: E402

import poolenvs  # noqa: E402
from shmvec.ray import (  # noqa: E402
    RESTART_INFO_KEY,
    RayActorDiedError,
    RayShmVecEnv,
    TooManyRestartsError,
    WorkerRestartWarning,
)
from shmvec.ray_pool import RayShmEnvPool, RayShmVecEnvPool  # noqa: E402
from test_equivalence import _check_coverage, _options, run_lockstep  # noqa: E402
from test_pool import _row, row_info  # noqa: E402

ACTOR_TITLE = "ray::_ShmVecActor"
LEAK_GRACE_S = 15.0


@pytest.fixture(scope="module")
def cluster():
    """A head node and one more node, 2 logical CPUs each; torn down after the module."""
    # A node removed by a test is found dead after a few missed health checks, not Ray's default 15 s.
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False, "_system_config": {
        "health_check_period_ms": 1000, "health_check_timeout_ms": 2000, "health_check_failure_threshold": 3}})
    try:
        c.add_node(num_cpus=2)
        c.wait_for_nodes()
        # The actors import the test envs by reference: put tests/ on their path, as a user
        # ships their own modules with runtime_env.
        ray.init(address=c.address, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": TESTS_DIR}})
        _warm_up()
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def _without_autoreset(metadata: dict) -> dict:
    return {k: v for k, v in metadata.items() if k != "autoreset_mode"}


@ray.remote(num_cpus=0)
class _Probe:
    def where(self) -> str:
        return ray.get_runtime_context().get_node_id()


def _warm_up() -> None:
    """An actor on every node, then killed: the driver opens its long-lived connection for
    actors now, rather than inside the first test (where the leak check would report it)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    probes = [_Probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
              for n in nodes]
    assert sorted(ray.get([p.where.remote() for p in probes], timeout=120)) == sorted(nodes)
    for p in probes:
        ray.kill(p)


def _descendants() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def _actor_processes() -> list[str]:
    out = []
    for proc in _descendants():
        try:
            cmdline = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
        if cmdline.startswith(ACTOR_TITLE):
            out.append(f"actor process still alive: pid {proc.pid}: {cmdline[:120]}")
    return out


@pytest.fixture(autouse=True)
def no_leaks(cluster):
    """conftest's leak check with Ray's idle worker pool left out (see the module docstring)."""
    before = take_snapshot()
    yield
    deadline = time.monotonic() + LEAK_GRACE_S
    while True:
        problems = [p for p in leaks_since(before) if not _ray_own(p)] + _actor_processes()
        if not problems or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    if problems:
        pytest.fail("test leaked resources:\n  " + "\n  ".join(problems), pytrace=False)


def _ray_own(problem: str) -> bool:
    """Ray's own comings and goings in the driver, not ours: its pooled workers (``ray::IDLE``,
    or ``default_worker.py`` while one starts and has not named itself yet) and the sockets of
    its gRPC channels, which it opens lazily.  The driver side of RayShmVecEnv opens nothing
    itself; the envs' processes, pipes and shared memory live in the actors, which are checked
    by ``_actor_processes`` and by the tests themselves (``_wait_gone``)."""
    return ("ray::IDLE" in problem or "default_worker.py" in problem
            or (problem.startswith("file descriptor") and "socket:[" in problem))


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def _workers_of(pid: int) -> list[int]:
    """The processes an actor started (its ShmVecEnv workers, forkserver, resource tracker)."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _wait_gone(pids: list[int], timeout: float = LEAK_GRACE_S) -> None:
    deadline = time.monotonic() + timeout
    while not _gone(pids):
        assert time.monotonic() < deadline, f"processes {pids} still alive"
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------------


def test_steps_match_dummy_vec_env_across_two_nodes(cluster):
    """Dict observations, uneven slices over the two nodes: every step equals DummyVecEnv's."""
    fns = testenvs.spaces_env_fns("dict", "multidiscrete", 7)
    ref = DummyVecEnv(fns)
    env = None
    try:
        env = RayShmVecEnv(fns, envs_per_actor=[3, 4], shm_kwargs={"n_workers": 2})
        assert env.n_actors == 2
        nodes = {info["node_id"] for info in env.actor_info}
        assert len(nodes) == 2, env.actor_info  # one actor per node
        assert [info["env_indices"] for info in env.actor_info] == [range(0, 3), range(3, 7)]
        assert [info["n_workers"] for info in env.actor_info] == [2, 2]
        pids = [info["pid"] for info in env.actor_info]
        workers = [w for pid in pids for w in _workers_of(pid)]
        assert len(workers) >= 4  # the actors' ShmVecEnv workers are real processes
        _check_coverage(run_lockstep(ref, env, options=_options(7)))
    finally:
        close_all(env, ref)
    _wait_gone(pids + workers)


def test_cartpole_through_make_vec_env_on_a_placement_group_matches_dummy(cluster):
    """SB3's make_vec_env (Monitor wrapped), one actor per bundle of a placement group spread over
    the two nodes: obs, rewards, dones and infos (episode stats, terminal_observation) equal."""
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    env = ref = None
    try:
        ray.get(pg.ready(), timeout=120)
        ref = make_vec_env("CartPole-v1", n_envs=6, seed=0, vec_env_cls=DummyVecEnv)
        env = make_vec_env("CartPole-v1", n_envs=6, seed=0, vec_env_cls=RayShmVecEnv,
                           vec_env_kwargs={"placement_group": pg})
        assert env.n_actors == 2
        assert len({i["node_id"] for i in env.actor_info}) == 2
        assert env.render_mode == ref.render_mode
        # gymnasium < 1.4 writes 'autoreset_mode' into the env class's own metadata dict whenever a
        # vector env of it is built, so this process's CartPoleEnv carries it after earlier tests and a
        # fresh actor's does not: not ours to compare.
        assert _without_autoreset(env.metadata) == _without_autoreset(ref.metadata)
        assert_same(env.reset(), ref.reset(), "reset obs", strict_dtype=True)
        env.action_space.seed(0)
        episodes = 0
        for i in range(150):
            act = np.array([env.action_space.sample() for _ in range(6)])
            obs_r, rew_r, done_r, infos_r = ref.step(act)
            obs_s, rew_s, done_s, infos_s = env.step(act)
            assert_same(obs_s, obs_r, f"step {i} obs", strict_dtype=True)
            assert_same(rew_s, rew_r, f"step {i} rewards", strict_dtype=True)
            assert_same(done_s, done_r, f"step {i} dones", strict_dtype=True)
            assert_same(infos_s, infos_r, f"step {i} infos", ignore=frozenset({"t"}))  # Monitor's clock
            episodes += int(done_r.sum())
        assert episodes > 6
    finally:
        close_all(env, ref)
        remove_placement_group(pg)


def test_attribute_and_method_calls_reach_the_right_env(cluster):
    """get_attr/set_attr/env_method/env_is_wrapped map global indices to (actor, local index)."""
    fns = [functools.partial(testenvs.make_spaces_env, "box", "discrete", i, render_mode="rgb_array")
           for i in range(5)]
    env = None
    try:
        env = RayShmVecEnv(fns, envs_per_actor=[2, 3])
        assert env.get_attr("tag") == [0, 1, 2, 3, 4]
        # order kept, across actors, with negative and repeated indices
        assert env.get_attr("tag", indices=[4, 0, -2, 1, 4]) == [4, 0, 3, 1, 4]
        assert env.env_method("describe", indices=[3, 1]) == ["box/discrete#3", "box/discrete#1"]
        env.set_attr("scale", 2.5, indices=[1, 2])
        assert env.get_attr("scale") == [1.0, 2.5, 2.5, 1.0, 1.0]
        # args and kwargs; an index given twice runs twice
        assert env.env_method("bump", 2, times=3, indices=[2, 2, 0]) == [6, 12, 6]
        assert env.env_is_wrapped(TimeLimit) == [True] * 5
        assert env.env_is_wrapped(DummyVecEnv, indices=[0, 4]) == [False, False]
        assert env.has_attr("tag") and not env.has_attr("no_such_attribute")
        with pytest.raises(IndexError):
            env.get_attr("tag", indices=[5])
        # an env's exception comes back as itself, naming where it ran; the env stays usable
        with pytest.raises(KeyError, match="ouch") as info:
            env.env_method("fail", "ouch", indices=[3])
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert "actor 1" in notes and "envs 2..4" in notes, notes
        # per-env seeds reach the env they name, across actors
        assert env.seed([7, 7, 8, 8, 7]) == [7, 7, 8, 8, 7]
        obs = env.reset()
        assert_same(obs[0], obs[1], "same seed, same first obs")
        assert_same(obs[0], obs[4], "same seed, same first obs")
        assert_same(obs[2], obs[3], "same seed, same first obs")
        assert not np.array_equal(obs[0], obs[2])
        assert len(set(env.seed(np.random.SeedSequence(3)))) == 5
        assert env.render_mode == "rgb_array"
        env.reset()
        images = env.get_images()
        assert [img.shape for img in images] == [(4, 6, 3)] * 5
        assert [int(img[0, 0, 0]) for img in images] == [0, 10, 20, 30, 40]  # tag * 10 at t=0
        obs, rewards, dones, infos = env.step(np.zeros(5, dtype=np.int64))
        assert obs.shape == (5, 5) and rewards.dtype == np.float32
        with pytest.raises(ValueError, match="shape"):
            env.step_async(np.zeros(4, dtype=np.int64))
        with pytest.raises(ValueError, match="dtype"):
            env.step_async(np.full(5, 0.5, dtype=np.float32))  # whole floats would be taken, as locally
        with pytest.raises(ValueError, match="shape"):
            env.step_async(np.zeros((1, 5), dtype=np.int64))  # transposed: refused, never reshaped
        env.step(np.zeros(5, dtype=np.int64))  # a refused action sent nothing
    finally:
        close_all(env)


@pytest.mark.parametrize("kind", ["vec_env", "pool"])
def test_close_leaves_no_multiprocessing_temp_folder_on_the_nodes(cluster, tmp_path, kind):
    """Each actor's forkserver keeps its socket in a ``pymp-*`` folder that multiprocessing removes
    at exit, and ``ray.kill`` runs no exit handler: every actor left one in /tmp.  The actors'
    temp dir is pointed at ``tmp_path`` here, so the folders can be seen and counted."""
    env_vars = {"PYTHONPATH": TESTS_DIR, "TMPDIR": str(tmp_path)}
    fns = testenvs.spaces_env_fns("box", "discrete", 4)
    env = None
    try:
        if kind == "vec_env":
            env = RayShmVecEnv(fns, n_actors=2, actor_options={"runtime_env": {"env_vars": env_vars}})
            env.reset()
            env.step(np.zeros(4, dtype=np.int64))
        else:
            env = RayShmEnvPool(fns, n_actors=2, batch_size=2,
                                actor_options={"runtime_env": {"env_vars": env_vars}})
            env.reset()
        pids = [info["pid"] for info in env.actor_info]
        workers = [w for pid in pids for w in _workers_of(pid)]
        folders = sorted(p.name for p in tmp_path.glob("pymp-*"))
        assert len(folders) == 2, folders  # one per actor: the check below can see them
        import copy
        import pickle

        for attempt in (copy.copy, copy.deepcopy, pickle.dumps):  # a copy would kill the actors when dropped
            with pytest.raises(TypeError, match=f"a {type(env).__name__} cannot be copied or pickled"):
                attempt(env)
    finally:
        close_all(env)
    _wait_gone(pids + workers)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_broken_ray_vec_env_dropped_without_close_is_freed_at_once(cluster):
    """As tests/units/test_dropped.py: no reference cycle through the failure it keeps (GC off)."""
    import gc
    import weakref

    fns = [functools.partial(testenvs.make_raising_env, 3 if i == 1 else 10**9) for i in range(4)]
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        env = RayShmVecEnv(fns, n_actors=2)
        pids = [i["pid"] for i in env.actor_info]
        env.reset()
        raised = []
        for call in (lambda: [env.step(np.zeros(4, dtype=np.int64)) for _ in range(5)], env.reset):
            try:
                call()
            except Exception as exc:  # noqa: BLE001 - named below
                raised.append(type(exc).__name__)
        del call
        assert raised == ["EnvBoom", "BrokenVecEnvError"]
        ref = weakref.ref(env)
        del env
        assert ref() is None, [type(r).__name__ for r in gc.get_referrers(ref())]
        _wait_gone(pids)
    finally:
        if enabled:
            gc.enable()


def test_actor_killed_mid_step_names_its_envs_and_close_still_works(cluster):
    """SIGKILL of one actor's process while it steps: RayActorDiedError naming actor, node, envs."""
    fns = [functools.partial(testenvs.make_sleepy_env, 1.5)] * 4
    env = None
    try:
        env = RayShmVecEnv(fns, n_actors=2)
        victim = env.actor_info[1]
        workers = _workers_of(victim["pid"])
        env.reset()
        env.step_async(np.zeros(4, dtype=np.int64))
        time.sleep(0.3)  # both actors are inside their step now
        os.kill(victim["pid"], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(RayActorDiedError) as info:
            env.step_wait()
        assert time.monotonic() - t0 < 30
        err = info.value
        assert isinstance(err, WorkerDiedError)
        assert err.worker == 1 and err.env_indices == range(2, 4)
        assert err.node_id == victim["node_id"] and err.pid == victim["pid"]
        message = str(err)
        assert "actor 1" in message and "envs 2..3" in message and victim["node_id"] in message
        assert "during step" in message and "close()" in message
        with pytest.raises(BrokenVecEnvError):
            env.step(np.zeros(4, dtype=np.int64))
        pids = [i["pid"] for i in env.actor_info]
        others = _workers_of(env.actor_info[0]["pid"])
        env.close()
        env.close()  # idempotent
        # the dead actor's ShmVecEnv workers notice their parent is gone and exit
        _wait_gone(pids + workers + others)
    finally:
        close_all(env)


def test_restart_replaces_a_killed_actor_and_truncates_its_episodes(cluster):
    """on_failure="restart": the killed actor's envs end a truncated episode and go on in a new
    actor; the other actor's envs are untouched (equal to DummyVecEnv throughout)."""
    fns = testenvs.spaces_env_fns("box", "discrete", 5)
    ref = DummyVecEnv(fns)
    env = None
    try:
        env = RayShmVecEnv(fns, n_actors=2, on_failure="restart", max_restarts=1)
        assert [i["env_indices"] for i in env.actor_info] == [range(0, 3), range(3, 5)]
        env.seed(5)
        ref.seed(5)
        obs = env.reset()
        assert_same(obs, ref.reset(), "reset obs")
        actions = np.zeros(5, dtype=np.int64)
        for _ in range(3):
            obs, *_ = env.step(actions)
            ref.step(actions)
        victim = env.actor_info[1]
        os.kill(victim["pid"], signal.SIGKILL)
        with pytest.warns(WorkerRestartWarning, match="actor 1"):
            obs2, rewards, dones, infos = env.step(actions)
        obs_r, rew_r, done_r, infos_r = ref.step(actions)
        assert env.restarts == 1 and env.actor_info[1]["pid"] != victim["pid"]
        # actor 0's envs: as if nothing happened
        assert_same(obs2[:3], obs_r[:3], "obs of actor 0")
        assert_same(rewards[:3], rew_r[:3], "rewards of actor 0")
        assert_same(infos[:3], infos_r[:3], "infos of actor 0")
        # actor 1's envs: a truncated episode end, the last observation as terminal observation
        assert dones[3:].all() and (rewards[3:] == 0).all()
        for i in (3, 4):
            assert infos[i]["TimeLimit.truncated"] is True
            assert_same(infos[i]["terminal_observation"], obs[i], f"terminal obs {i}")
            assert "actor 1" in infos[i][RESTART_INFO_KEY] and "died" in infos[i][RESTART_INFO_KEY]
            assert env.reset_infos[i]["tag"] == i  # the new env's reset info
        env.step(actions)  # and it goes on
        os.kill(env.actor_info[1]["pid"], signal.SIGKILL)
        with pytest.raises(TooManyRestartsError, match="max_restarts=1"):
            env.step(actions)
        with pytest.raises(BrokenVecEnvError):
            env.step(actions)
    finally:
        close_all(env, ref)


def test_worker_restart_inside_an_actor_reaches_the_driver(cluster):
    """shm_kwargs={"on_failure": "restart"}: the actor's own ShmVecEnv restarts its failed worker;
    the truncation and the restart flag cross to the driver, and no actor is replaced."""
    fns = [functools.partial(testenvs.make_sleepy_env, 0.0)] * 2 + [functools.partial(testenvs.make_raising_env, 2)]
    env = None
    try:
        env = RayShmVecEnv(fns, n_actors=2, shm_kwargs={"on_failure": "restart"})
        env.reset()
        actions = np.zeros(3, dtype=np.int64)
        obs, _, dones, _ = env.step(actions)
        _, rewards, dones, infos = env.step(actions)  # env 2 raises EnvBoom in its worker
        assert dones.tolist() == [False, False, True] and rewards[2] == 0
        assert infos[2]["TimeLimit.truncated"] is True
        assert "EnvBoom" in infos[2][RESTART_INFO_KEY]
        assert_same(infos[2]["terminal_observation"], obs[2], "terminal obs")
        assert RESTART_INFO_KEY not in infos[0] and env.restarts == 0
        env.step(actions)
    finally:
        close_all(env)


def test_lost_node_names_the_actor_and_node(cluster):
    """A node that goes away takes its actor with it: RayActorDiedError names it; close works."""
    node = cluster.add_node(num_cpus=1)
    env = None
    try:
        cluster.wait_for_nodes()
        fns = [functools.partial(testenvs.make_sleepy_env, 0.0)] * 3
        env = RayShmVecEnv(fns)  # one actor per node, the new one included
        doomed = [k for k, i in enumerate(env.actor_info) if i["node_id"] == node.node_id]
        assert doomed, env.actor_info
        env.reset()
        env.step(np.zeros(3, dtype=np.int64))
        cluster.remove_node(node, allow_graceful=False)
        node = None
        deadline = time.monotonic() + 60
        with pytest.raises(RayActorDiedError) as info:
            while time.monotonic() < deadline:  # until Ray notices
                env.step(np.zeros(3, dtype=np.int64))
                time.sleep(0.05)
        assert info.value.worker in doomed
        assert env.actor_info[info.value.worker]["node_id"] in str(info.value)
        env.close()
        # the next tests count alive nodes: wait until Ray's view has the node dead
        dead_id = env.actor_info[info.value.worker]["node_id"]
        while any(n["NodeID"] == dead_id and n["Alive"] for n in ray.nodes()):
            assert time.monotonic() < deadline + 60, "Ray still reports the removed node alive"
            time.sleep(0.2)
    finally:
        close_all(env)
        if node is not None:
            cluster.remove_node(node)


def test_env_exception_in_step_is_raised_as_itself(cluster):
    """An env raising inside an actor's worker: EnvBoom, with the env's traceback; then broken."""
    fns = [functools.partial(testenvs.make_sleepy_env, 0.0)] * 2 + [
        functools.partial(testenvs.make_raising_env, 2)]
    env = None
    try:
        env = RayShmVecEnv(fns, n_actors=2, timeout=60)
        env.reset()
        env.step(np.zeros(3, dtype=np.int64))
        with pytest.raises(testenvs.EnvBoom) as info:
            env.step(np.zeros(3, dtype=np.int64))
        notes = "\n".join(info.value.__notes__)
        assert "env 0" in notes  # local index within the actor's ShmVecEnv ...
        assert "actor 1" in notes and "holds env 2:" in notes  # ... and where that is globally
        assert "boom after 2 steps" in str(info.value.__cause__)  # the worker's traceback
        with pytest.raises(BrokenVecEnvError):
            env.reset()
    finally:
        close_all(env)


def test_a_native_crash_inside_an_actor_brings_its_stack_to_the_driver(cluster):
    """A worker of an actor's ShmVecEnv dies of SIGSEGV: the driver's WorkerDiedError names the env
    (local to the actor, as for an env's exception) and its cause, the actor's traceback, holds the
    worker's Python stack at the crash (shmvec._crash)."""
    fns = [functools.partial(faultenvs.make_crash_env, i, **({"at": 2, "how": "segv"} if i == 3 else {}))
           for i in range(4)]
    env = None
    try:
        env = RayShmVecEnv(fns, n_actors=2, timeout=60)
        env.reset()
        env.step(np.zeros(4, dtype=np.int64))
        with pytest.raises(WorkerDiedError) as info:
            env.step(np.zeros(4, dtype=np.int64))
        assert "signal SIGSEGV (11), in env 1" in str(info.value)  # env 1 of actor 1's two
        actor_tb = str(info.value.__cause__)
        assert "Fatal Python error: Segmentation fault" in actor_tb and "in _maybe_crash" in actor_tb
    finally:
        close_all(env)


def test_timeout_names_the_late_actor(cluster):
    # Actor 0 must answer a trivial step within the timeout even on a loaded machine (0.5 s was not
    # always enough, and then the error named actors [0, 1]); actor 1's env sleeps well past it, but
    # ends within the leak check's grace (its worker only sees the killed actor once the sleep is over).
    fns = [functools.partial(testenvs.make_sleepy_env, 0.0), functools.partial(testenvs.make_sleepy_env, 8.0)]
    env = None
    try:
        env = RayShmVecEnv(fns, n_actors=2, timeout=3.0)
        env.reset()
        with pytest.raises(WorkerTimeoutError, match=r"actors \[1\] \(env 1\)"):
            env.step(np.zeros(2, dtype=np.int64))
    finally:
        close_all(env)


def test_bad_arguments_are_refused_before_any_actor_starts(cluster):
    fns = [testenvs.make_cartpole] * 2
    with pytest.raises(ValueError, match="fork"):
        RayShmVecEnv(fns, shm_kwargs={"start_method": "fork"})
    with pytest.raises(ValueError, match="on_failure must be one of"):
        RayShmVecEnv(fns, on_failure="retry")
    with pytest.raises(ValueError, match="3 actors for 2 envs"):
        RayShmVecEnv(fns, n_actors=3)
    with pytest.raises(ValueError, match="envs_per_actor"):
        RayShmVecEnv(fns, envs_per_actor=[2, 0])
    with pytest.raises(TypeError, match="not a factory"):
        RayShmVecEnv([testenvs.make_cartpole()] * 2)
    lock = __import__("threading").Lock()
    with pytest.raises(TypeError, match="cannot be pickled"):
        RayShmVecEnv([lambda: lock] * 2, n_actors=2)


# ---- restart during rare calls, describe() -----------------------------------------------------------


def test_actor_dying_during_a_rare_call_is_restarted_and_the_call_raises(cluster):
    """on_failure="restart": get_attr on a dead actor raises RayActorDiedError saying the actor was
    replaced and the call not retried; the vec env stays usable, and the next step reports the
    new actor's envs as truncated episodes (without stepping them)."""
    fns = testenvs.spaces_env_fns("box", "discrete", 4, term_prob=0.0)  # no random episode ends
    env = None
    try:
        env = RayShmVecEnv(fns, n_actors=2, on_failure="restart")
        obs = env.reset()
        actions = np.zeros(4, dtype=np.int64)
        obs, *_ = env.step(actions)
        victim = env.actor_info[1]
        os.kill(victim["pid"], signal.SIGKILL)
        with pytest.warns(WorkerRestartWarning, match="actor 1"), pytest.raises(RayActorDiedError) as info:
            env.get_attr("tag")
        message = str(info.value)
        assert info.value.env_indices == range(2, 4) and "during get_attr" in message
        assert "not retried" in message and "still usable" in message, message
        assert env.restarts == 1 and env.actor_info[1]["pid"] != victim["pid"]
        assert env.get_attr("tag") == [0, 1, 2, 3]  # usable: the new actor answers
        obs2, rewards, dones, infos = env.step(actions)
        assert dones.tolist() == [False, False, True, True] and (rewards[2:] == 0).all()
        for i in (2, 3):
            assert infos[i]["TimeLimit.truncated"] is True
            assert_same(infos[i]["terminal_observation"], obs[i], f"terminal obs {i}")
            assert "during get_attr" in infos[i][RESTART_INFO_KEY]
        assert RESTART_INFO_KEY not in infos[0]
        _, _, dones, infos = env.step(actions)  # and it goes on, the new envs stepping
        assert not any(RESTART_INFO_KEY in info for info in infos)
    finally:
        close_all(env)


def test_what_a_local_shmvecenv_carries_crosses_ray_too(cluster, monkeypatch):
    """Infos only cloudpickle carries, an env error that does not pickle, an invalid action (with
    global indices, nothing sent, the vec env usable), a dead worker inside an actor (global
    indices), and calls after ray.shutdown() (a clear error, not a new cluster)."""
    import faultenvs
    from shmvec import InvalidActionError, RemoteEnvError

    fns = [functools.partial(testenvs.make_callable_info_env, i) for i in range(3)] + [
        functools.partial(faultenvs.make_crash_env, 3, at=0, how="raise_unpicklable", where="attr")]
    env = None
    try:
        env = RayShmVecEnv(fns, n_actors=2, timeout=60)  # actor 1: envs 2..3
        env.reset()
        _, _, _, infos = env.step(np.zeros(4, dtype=np.int64))
        assert [infos[i]["scale"](10) for i in range(3)] == [20, 30, 40]
        with pytest.raises(RemoteEnvError, match="UnpicklableError"):
            env.get_attr("explode", indices=[3])
        with pytest.raises(InvalidActionError) as info:
            env.step(np.array([0, 1, 2, 5]))
        assert list(info.value.env_indices) == [3]
        env.step(np.zeros(4, dtype=np.int64))  # still usable
        monkeypatch.setattr(ray, "is_initialized", lambda: False)
        with pytest.raises(ClosedVecEnvError, match="ray.shutdown"):
            env.step(np.zeros(4, dtype=np.int64))
        monkeypatch.undo()
        os.kill(env.get_attr("worker_pid", indices=[2])[0], signal.SIGKILL)
        with pytest.raises(WorkerDiedError) as died:
            for _ in range(3):
                env.step(np.zeros(4, dtype=np.int64))
        assert 2 in died.value.env_indices and set(died.value.env_indices) <= {2, 3}  # global, not local
    finally:
        close_all(env)


def test_a_dead_worker_inside_an_actor_found_by_a_rare_call_restarts_it_under_w_error(cluster):
    """on_failure="restart", WorkerRestartWarning turned into an error: a worker of actor 1 killed
    between steps; get_attr replaces the actor and raises the warning, and the next step still
    reports its envs as truncated (the restart was lost, the actor left broken until a step)."""
    import warnings

    fns = testenvs.spaces_env_fns("box", "discrete", 4, term_prob=0.0)
    env = None
    try:
        env = RayShmVecEnv(fns, n_actors=2, on_failure="restart")
        env.reset()
        obs, *_ = env.step(np.zeros(4, dtype=np.int64))
        pid = env.actor_info[1]["pid"]
        os.kill(env.get_attr("worker_pid", indices=[2])[0], signal.SIGKILL)
        with warnings.catch_warnings():
            warnings.simplefilter("error", WorkerRestartWarning)
            with pytest.raises(WorkerRestartWarning, match="actor 1"):
                env.get_attr("tag")
        assert env.restarts == 1 and env.actor_info[1]["pid"] != pid
        assert env.get_attr("tag") == [0, 1, 2, 3]
        _, rewards, dones, infos = env.step(np.zeros(4, dtype=np.int64))
        assert dones.tolist() == [False, False, True, True] and (rewards[2:] == 0).all()
        assert all("WorkerDiedError during get_attr" in infos[i][RESTART_INFO_KEY] for i in (2, 3))
        assert_same(infos[2]["terminal_observation"], obs[2], "terminal obs")
    finally:
        close_all(env)


def test_describe_round_trip_rebuilds_the_same_vec_env(cluster):
    """describe() is JSON; from_description() on the cluster rebuilds envs, options and seeds."""
    import json

    from shmvec.factories import DescriptionError

    fns = testenvs.spaces_env_fns("box", "discrete", 5)
    env = rebuilt = None
    try:
        env = RayShmVecEnv(fns, n_actors=2, envs_per_actor=[2, 3], shm_kwargs={"n_workers": 1},
                           on_failure="restart", max_restarts=3)
        env.seed(7)
        text = json.dumps(env.describe())
        want = _rollout(env, 20)
        env.close()
        loaded = json.loads(text)
        assert loaded["n_envs"] == 5 and loaded["vec_env"] == "shmvec.ray.RayShmVecEnv"
        assert loaded["options"]["envs_per_actor"] == [2, 3] and loaded["options"]["on_failure"] == "restart"
        rebuilt = RayShmVecEnv.from_description(loaded, max_restarts=5)
        assert rebuilt.max_restarts == 5 and rebuilt.on_failure == "restart"
        assert [i["env_indices"] for i in rebuilt.actor_info] == [range(0, 2), range(2, 5)]
        assert_same(_rollout(rebuilt, 20), want, "rebuilt rollout")  # seeds come from the description
        rebuilt.close()
        rebuilt = RayShmVecEnv([lambda: testenvs.make_spaces_env()] * 2, n_actors=1)
        with pytest.raises(DescriptionError, match=r"env_fns\[0\]"):
            rebuilt.describe()
    finally:
        close_all(env, rebuilt)


def _rollout(env, n_steps: int) -> list:
    out = [env.reset()]
    rng = np.random.default_rng(1)
    for _ in range(n_steps):
        obs, rew, dones, _ = env.step(rng.integers(0, 3, size=env.num_envs))
        out.append((obs, rew, dones))
    return out


# ---- pool mode ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, obs_kind, actor_batch", [
    (AutoresetMode.NEXT_STEP, "dict", 1),
    (AutoresetMode.SAME_STEP, "box", None),
])
def test_pool_each_env_follows_its_own_trajectory_across_two_nodes(cluster, mode, obs_kind, actor_batch):
    """RayShmEnvPool over two nodes (uneven slices), batches smaller than the pool: global env ids,
    and every env's rows (obs, rewards, flags, infos) equal that env run alone in a one-env
    SyncVectorEnv with the same seed, actions and autoreset mode, whatever order they arrive in."""
    n_envs, batch = 7, 3 if actor_batch == 1 else 4
    envs_per_actor = [3, 4] if actor_batch == 1 else [4, 3]
    fns = [functools.partial(poolenvs.make_jitter_env, obs_kind, "discrete", i, 0.002) for i in range(n_envs)]
    refs = [SyncVectorEnv([fn], autoreset_mode=mode) for fn in fns]
    pool = None
    try:
        pool = RayShmEnvPool(fns, batch_size=batch, envs_per_actor=envs_per_actor, actor_batch_size=actor_batch,
                             autoreset_mode=mode, shm_kwargs={"n_workers": 2})
        assert len({i["node_id"] for i in pool.actor_info}) == 2
        assert pool.metadata["autoreset_mode"] == mode and pool.num_envs == n_envs
        obs, infos = pool.reset(seed=11)
        ref_first = [ref.reset(seed=11 + i) for i, ref in enumerate(refs)]
        rng = np.random.default_rng(0)
        sent: dict[int, int] = {}
        seen_reset: set[int] = set()
        steps = np.zeros(n_envs, dtype=np.int64)
        orders, ended = set(), 0
        for t in range(40):
            ids = infos["env_id"]
            assert ids.dtype == np.int64 and len(set(ids.tolist())) == batch
            orders.add(tuple(ids.tolist()))
            for k, i in enumerate(ids.tolist()):
                if i not in sent:  # its reset row
                    assert i not in seen_reset
                    seen_reset.add(i)
                    assert_same(_row(obs, k), _row(ref_first[i][0], 0), f"env {i} reset obs", strict_dtype=True)
                    assert_same(row_info(infos, k), row_info(ref_first[i][1], 0), f"env {i} reset info")
                    continue
                want = refs[i].step(np.array([sent.pop(i)]))
                steps[i] += 1
                where = f"recv {t} env {i}"
                assert_same(_row(obs, k), _row(want[0], 0), f"{where} obs", strict_dtype=True)
                assert rew[k] == want[1][0] and term[k] == want[2][0] and trunc[k] == want[3][0], where
                got_info, want_info = row_info(infos, k), row_info(want[4], 0)
                if "final_obs" in want_info:
                    assert_same(got_info.pop("final_obs"), want_info.pop("final_obs"), f"{where} final_obs")
                assert_same(got_info, want_info, f"{where} info")
                ended += int(term[k] or trunc[k])
            actions = rng.integers(0, 3, size=len(ids))
            pool.send(actions, ids)
            sent.update(zip(ids.tolist(), actions.tolist()))
            obs, rew, term, trunc, infos = pool.recv()
        assert seen_reset == set(range(n_envs)) and (steps > 3).all() and ended > 0
        assert len(orders) > 3  # batches were made of different envs
        # rare calls reach every env, in env order, while envs are in flight
        assert pool.get_attr("tag") == tuple(range(n_envs))
        pool.set_attr("scale", [float(i) for i in range(n_envs)])
        assert pool.call("describe") == tuple(f"{obs_kind}/discrete#{i}" for i in range(n_envs))
        assert pool.get_attr("scale") == tuple(float(i) for i in range(n_envs))
        pool.send(rng.integers(0, 3, size=len(infos["env_id"])), infos["env_id"])
        pool.recv()  # the batches kept across the calls still come back
    finally:
        for ref in refs:
            ref.close()
        close_all(pool)


def test_pool_misuse_is_refused(cluster):
    fns = [functools.partial(testenvs.make_spaces_env, "box", "discrete", i) for i in range(4)]
    pool = None
    try:
        with pytest.raises(ValueError, match="batch_size"):
            RayShmEnvPool(fns, batch_size=5)
        pool = RayShmEnvPool(fns, batch_size=2, n_actors=2)
        assert pool.actor_batch_sizes == [2, 2]
        with pytest.raises(ShmVecEnvError, match="before reset"):
            pool.send(np.zeros(2, dtype=np.int64), [0, 1])
        obs, infos = pool.reset(seed=0)
        ids = infos["env_id"]
        with pytest.raises(ValueError, match="in flight"):
            pool.send(np.zeros(2, dtype=np.int64), [i for i in range(4) if i not in ids.tolist()])
        with pytest.raises(ValueError, match="shape"):
            pool.send(np.zeros(3, dtype=np.int64), ids)
        with pytest.raises(ValueError, match="distinct"):
            pool.send(np.zeros(2, dtype=np.int64), [ids[0], ids[0]])
        from shmvec import InvalidActionError
        with pytest.raises(InvalidActionError) as info:  # refused in the driver: nothing is sent
            pool.send(np.array([0, 7]), ids)  # Discrete(3)
        assert info.value.env_indices == [int(ids[1])] and not pool._in_flight[ids].any()
        pool.recv()  # the other actor's batch, arrived with the first
        with pytest.raises(ShmVecEnvError, match="too few envs in flight"):
            pool.recv()
        pool.send(np.zeros(1, dtype=np.int64), ids[:1])  # half of an actor's batch: still too few
        with pytest.raises(ShmVecEnvError, match="too few envs in flight"):
            pool.recv()
        pool.send(np.zeros(1, dtype=np.int64), ids[1:])
        _, _, _, _, infos = pool.recv()
        assert sorted(infos["env_id"].tolist()) == sorted(ids.tolist())
        pool.close()
        with pytest.raises(ClosedVecEnvError):
            pool.recv()
    finally:
        close_all(pool)


def test_pool_actor_killed_mid_step_names_its_envs(cluster):
    """SIGKILL of one actor while its envs step in the pool: the recv that finds it raises
    RayActorDiedError naming actor, node and envs, while the other actor's batches come back
    until then; the pool is broken afterwards and close() releases both nodes."""
    # Each step sleeps long enough that actor 1 is surely still inside its step when it is killed
    # (with 0.3 s a stalled driver could kill it only after its batch was back, and then recv
    # returned envs 2 and 3).
    fns = [functools.partial(testenvs.make_sleepy_env, 1.0)] * 4
    pool = None
    try:
        pool = RayShmEnvPool(fns, batch_size=2, n_actors=2)
        victim = pool.actor_info[1]
        workers = _workers_of(victim["pid"])
        _, infos = pool.reset()
        pool.send(np.zeros(2, dtype=np.int64), infos["env_id"])
        _, _, _, _, infos = pool.recv()
        pool.send(np.zeros(2, dtype=np.int64), infos["env_id"])
        os.kill(victim["pid"], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(RayActorDiedError) as info:
            while time.monotonic() - t0 < 30:
                _, _, _, _, infos = pool.recv()
                assert set(infos["env_id"].tolist()) == {0, 1}  # actor 0's envs go on meanwhile
                pool.send(np.zeros(2, dtype=np.int64), infos["env_id"])
        err = info.value
        assert err.worker == 1 and err.env_indices == range(2, 4) and err.pid == victim["pid"]
        message = str(err)
        assert "actor 1" in message and "envs 2..3" in message and victim["node_id"] in message
        assert "during pool recv" in message
        with pytest.raises(BrokenVecEnvError):
            pool.recv()
        pids = [i["pid"] for i in pool.actor_info]
        others = _workers_of(pool.actor_info[0]["pid"])
        pool.close()
        _wait_gone(pids + workers + others)
    finally:
        close_all(pool)


def test_pool_env_exception_is_raised_as_itself(cluster):
    fns = [functools.partial(testenvs.make_sleepy_env, 0.0)] * 2 + [functools.partial(testenvs.make_raising_env, 1)]
    pool = None
    try:
        pool = RayShmEnvPool(fns, batch_size=3, n_actors=2, timeout=60)
        _, infos = pool.reset()
        with pytest.raises(testenvs.EnvBoom) as info:
            for _ in range(3):
                pool.send(np.zeros(3, dtype=np.int64), infos["env_id"])
                _, _, _, _, infos = pool.recv()
        notes = "\n".join(info.value.__notes__)
        assert "actor 1" in notes and "holds env 2:" in notes
        with pytest.raises(BrokenVecEnvError):
            pool.recv()
    finally:
        close_all(pool)


def test_sb3_pool_face_with_full_batch_equals_dummy_vec_env(cluster):
    """RayShmVecEnvPool with batch_size == num_envs: rows in env order, DummyVecEnv step for step."""
    fns = testenvs.spaces_env_fns("box", "discrete", 5)
    ref = DummyVecEnv(fns)
    env = None
    try:
        env = RayShmVecEnvPool(fns, n_actors=2)
        assert env.num_envs == 5 and env.pool_size == 5
        assert assert_pool_matches_dummy(env, ref, 30, 3) > 0
        assert env.get_attr("tag") == [0, 1, 2, 3, 4]
        assert env.env_is_wrapped(TimeLimit, indices=[4, 0]) == [True, True]
        env.set_attr("marker", 1, indices=[3, 1])  # only those: each actor gets its own local indices
        assert env.env_method("bump", 2, indices=[4, 0, 2]) == [2, 2, 2]
        assert env.get_attr("counter") == [2, 0, 2, 0, 2]
        assert env.get_attr("marker", indices=[1, 3]) == [1, 1]
        with pytest.raises(IndexError, match="out of range"):
            env.set_attr("marker", 1, indices=[5])  # not env 0, wrapped around
        with pytest.raises(NotImplementedError, match="each Ray actor's vec env decides"):
            env.decided()  # ShmVecEnvPool's, which asks a pool of its own
    finally:
        close_all(env, ref)


def test_sb3_pool_face_carries_each_envs_own_infos(cluster):
    """Infos of uneven types and lengths (Gymnasium's batching would fail or truncate) arrive as
    DummyVecEnv's through the actors."""
    fns = [functools.partial(testenvs.make_uneven_info_env, i) for i in range(4)]
    ref = DummyVecEnv(fns)
    env = None
    try:
        env = RayShmVecEnvPool(fns, n_actors=2)
        assert assert_pool_matches_dummy(env, ref, 16, 3) > 0
    finally:
        close_all(env, ref)
