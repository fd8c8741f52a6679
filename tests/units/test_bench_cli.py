"""The benchmark (``python -m shmvec.bench``) on tiny configurations: structure, skips, errors.

Timings are never asserted (a shared machine makes them meaningless); what is checked is that every
measure is there, consistent with the others, and that a backend that cannot run is a note, not an error.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from helpers import REPO_ROOT, SB3
from shmvec import bench
from shmvec._bench import backends as B
from shmvec._bench.envs import EnvFactory, check_env_name, obs_nbytes
from shmvec._bench.measures import ACTION_BATCHES, Ceiling, Stepper, median_ratio, side_by_side, tree_memory
from shmvec._bench.remote import RemoteBackend, RemoteError, children as remote_children

ROOT = REPO_ROOT  # the checkout: bench/ scripts

BENCH_ENVS = ["CartPole-v1", "CartPole-monitor", "busy-50us", "image-84x84x4", "image-210x160x3", "CartPole-info",
              "dict-obs", "zero-cost"]
TINY = ["--seconds", "0.2", "--rounds", "2", "--quiet"]


@pytest.fixture(scope="module", autouse=True)
def _multiprocessing_heap():
    """Gymnasium's AsyncVectorEnv(shared_memory=True) allocates from multiprocessing's process-wide heap,
    whose arenas (a descriptor each) live as long as the process: make one before the leak check's
    snapshots, so that the small buffers of these tests come from it."""
    import multiprocessing as mp

    block = mp.get_context("fork").Array("B", 1 << 20, lock=False)
    del block
    yield


def _run_cli(argv, capsys):
    rc = bench.main(argv)
    return rc, capsys.readouterr()


@pytest.mark.parametrize("name", BENCH_ENVS)
def test_bench_envs_pass_gymnasium_checker(name):
    env = EnvFactory(name)()
    try:
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


def test_env_names_are_checked():
    assert check_env_name("busy-1234us") == "busy-1234us"
    assert check_env_name("image-8x8x1") == "image-8x8x1"
    with pytest.raises(ValueError, match="busy-<N>us"):
        check_env_name("busy-fast")


def test_busy_env_burns_its_cpu_time():
    import time

    env = EnvFactory("busy-2000us")()
    env.reset(seed=0)
    t0 = time.thread_time()
    for _ in range(5):
        env.step(0)
    assert time.thread_time() - t0 >= 5 * 2000e-6
    env.close()


def test_image_and_dict_observations():
    env = EnvFactory("image-210x160x3")()
    obs, _ = env.reset(seed=0)
    assert obs.shape == (210, 160, 3) and obs.dtype == np.uint8
    assert obs_nbytes(env.observation_space) == 210 * 160 * 3
    env.close()
    env = EnvFactory("dict-obs")()
    assert isinstance(env.observation_space, gym.spaces.Dict)
    assert obs_nbytes(env.observation_space) == 4 * 4 + 16 * 16 + 8
    env.close()


def test_cartpole_monitor_is_what_make_vec_env_builds():
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    ours = EnvFactory("CartPole-monitor")()
    theirs = make_vec_env("CartPole-v1", n_envs=1, vec_env_cls=DummyVecEnv).envs[0]
    try:
        chain = []
        for env in (ours, theirs):
            kinds, e = [], env
            while isinstance(e, gym.Wrapper):
                kinds.append(type(e))
                e = e.env
            chain.append((kinds, type(e)))
        assert chain[0] == chain[1] and chain[0][0][0] is Monitor
    finally:
        ours.close()
        theirs.close()


def test_sb3_envs_are_not_offered_to_a_remote_interpreter():
    remote = [b for b in B.REGISTRY.values() if b.remote]
    assert remote and not any(b.supports("CartPole-monitor") for b in remote)
    assert B.get("ShmVecEnv").supports("CartPole-monitor")


@pytest.mark.parametrize("env", ["CartPole-v1", "CartPole-monitor", "image-84x84x4", "dict-obs", "CartPole-info"])
@pytest.mark.parametrize("backend", [n for n, b in B.REGISTRY.items() if not b.remote and not b.multiagent
                                     and b.by_default])
def test_every_backend_steps_every_env(backend, env):
    b = B.get(backend)
    if b.missing():
        pytest.skip(f"{backend}: {b.missing()}")
    if not b.supports(env):
        pytest.skip(f"{backend}: {b.unsupported(env)}")
    handle = B.build(backend, B.BuildSpec(env, 2, 2, "fork"))
    try:
        handle.reset()
        actions = handle.sample_actions(4)
        assert len(actions) == 4 and len(actions[0]) == 2
        for a in actions:
            out = handle.step(a)
        obs = out[0]
        rows = handle.envs_per_step or 2  # an async pool returns its batch
        single = EnvFactory(env)().observation_space
        first = obs["state"] if isinstance(obs, dict) else obs
        assert len(first) == rows
        if isinstance(single, gym.spaces.Box):
            assert obs.shape == (rows, *single.shape)
    finally:
        handle.close()


LIBRARY_PAIRS = [("TorchRL-Parallel", "TorchRL-shmvec"), ("Tianshou-Subproc", "Tianshou-shmvec")]


def test_library_pairs_run_only_when_named(capsys):
    named = [n for pair in LIBRARY_PAIRS for n in pair]
    assert not set(named) & set(B.backend_names()) and set(named) <= set(B.backend_names(all_=True))
    assert not set(named) & set(bench.Config().backends)
    for peer, ours in LIBRARY_PAIRS:
        assert B.get(ours).versus == peer and not B.get(peer).versus
    assert bench.main(["--list"]) == 0
    assert "measured against TorchRL-Parallel" in capsys.readouterr().out


@pytest.mark.parametrize("pair", LIBRARY_PAIRS, ids=[p[0].split("-")[0] for p in LIBRARY_PAIRS])
def test_library_pair_measured_side_by_side(pair, tmp_path, capsys):
    """The other library's parallel env and shmvec through that library's API, in one run: a tiny point."""
    for name in pair:
        if B.get(name).missing():
            pytest.skip(f"{name}: {B.get(name).missing()}")
    out = tmp_path / "r.json"
    rc, cap = _run_cli(["--envs", "CartPole-v1", "--n-envs", "2", "--backends", *pair, "--no-footprint",
                        "--no-latency", "--json", str(out), *TINY], capsys)
    assert rc == 0
    r = json.loads(out.read_text())
    assert {p["backend"] for p in r["points"]} == set(pair) and not r["skipped"]
    assert all(len(p["rounds"]) == 2 and p["steps_per_s"] > 0 for p in r["points"])
    [q] = r["pairs"]
    assert (q["backend"], q["versus"], q["n_envs"]) == (pair[1], pair[0], 2) and q["ratio"] > 0
    assert f"{pair[1]} runs" in cap.out
    assert bench.main(["--from-json", str(out), "--markdown"]) == 0
    assert f"| CartPole-v1 | 2 | {pair[1]} | {pair[0]} |" in capsys.readouterr().out


@SB3
def test_library_pairs_skip_without_their_library(monkeypatch, tmp_path, capsys):
    for module in ("torchrl", "tianshou"):
        monkeypatch.setitem(sys.modules, module, None)  # find_spec answers None: not installed
    out = tmp_path / "r.json"
    names = [n for pair in LIBRARY_PAIRS for n in pair]
    rc, cap = _run_cli(["--envs", "CartPole-v1", "--n-envs", "2", "--backends", "DummyVecEnv", *names,
                        "--no-footprint", "--no-latency", "--json", str(out), *TINY], capsys)
    assert rc == 0
    r = json.loads(out.read_text())
    reasons = {s["backend"]: s["reason"] for s in r["skipped"]}
    assert set(reasons) == set(names)
    assert reasons["TorchRL-shmvec"] == "torchrl is not installed"
    assert reasons["Tianshou-Subproc"] == "tianshou is not installed"
    assert [p["backend"] for p in r["points"]] == ["DummyVecEnv"] and r["pairs"] == []
    assert "Skipped:" in cap.out


def test_side_by_side_gives_each_stepper_every_round():
    class Fake:
        def __init__(self, sps):
            self.sps, self.calls = sps, []

        def chunk(self, seconds):
            self.calls.append(seconds)
            return self.sps

    a, b = Fake(100.0), Fake(50.0)
    rounds = side_by_side({"a": a, "b": b}, 1.0, 4)
    assert rounds == {"a": [100.0] * 4, "b": [50.0] * 4}
    assert a.calls == [0.25] * 4  # each is measured `seconds` in all
    assert median_ratio(rounds["b"], rounds["a"]) == 0.5


def test_stepper_counts_env_steps():
    calls = []
    stepper = Stepper(calls.append, [np.zeros(3)] * 2, num_envs=3, warmup_steps=5)
    assert len(calls) == 5
    sps = stepper.chunk(0.01)
    assert sps > 0 and len(calls) > 5
    assert len(stepper.latency_us(7)) == 7


def test_tree_memory_counts_children():
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    ev = ctx.Event()
    p = ctx.Process(target=ev.wait, args=(30,))
    alone = tree_memory()
    p.start()
    try:
        with_child = tree_memory()
    finally:
        ev.set()
        p.join()
    assert with_child["processes"] == alone["processes"] + 1
    assert with_child["kind"] in ("pss", "rss")
    assert with_child["bytes"] > 0


@SB3
def test_cli_tiny_run_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc, cap = _run_cli(["--envs", "CartPole-v1", "--n-envs", "1", "2", "--backends", "DummyVecEnv", "ShmVecEnv",
                        "--no-footprint", "--no-latency", "--json", str(out), *TINY], capsys)
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["version"] == bench.RESULTS_VERSION
    assert r["machine"]["cores"] >= 1 and r["config"]["seconds"] == 0.2
    assert r["bare"]["CartPole-v1"] > 0
    assert math.isclose(r["limit"]["CartPole-v1"], r["limit_cores"] * r["bare"]["CartPole-v1"])
    assert {(p["backend"], p["n_envs"]) for p in r["points"]} == {
        (b, n) for b in ("DummyVecEnv", "ShmVecEnv") for n in (1, 2)}
    for p in r["points"]:
        assert len(p["rounds"]) == 2 and p["steps_per_s"] > 0
        assert math.isclose(p["share_of_limit"], p["steps_per_s"] / r["limit"]["CartPole-v1"])
        if p["backend"] == "DummyVecEnv":
            assert p["ratio_to_dummy"] == 1.0
    assert set(r["shmvec_vs"]["CartPole-v1"]["2"]) == {"DummyVecEnv"}
    assert r["footprint"] == [] and r["latency"] == []
    assert "x Dummy" in cap.out and "ShmVecEnv runs" in cap.out
    # The ceiling: limit_cores bare loops at once, measured in the same rounds as the backends.
    assert [(c["n_envs"], c["processes"]) for c in r["ceiling"]] == [(1, r["limit_cores"]), (2, r["limit_cores"])]
    for c in r["ceiling"]:
        assert len(c["rounds"]) == 2 and c["steps_per_s"] > 0
        for p in (p for p in r["points"] if p["n_envs"] == c["n_envs"]):
            assert math.isclose(p["share_of_ceiling"], median_ratio(p["rounds"], c["rounds"]))
    assert "of ceiling" in cap.out and "bare loops" in cap.out


def test_ceiling_runs_k_loops_at_once_and_leaves_nothing():
    ceiling = Ceiling("CartPole-v1", 2)
    try:
        pids = [p.pid for p in ceiling.procs]
        assert len(pids) == 2 and ceiling.workers == 2
        assert all(ceiling.chunk(0.05) > 0 for _ in range(2))
    finally:
        ceiling.close()
    assert ceiling.procs == [] and ceiling.conns == []
    ceiling.close()  # idempotent


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One tiny run with start-up, memory and latency (each backend in a fresh interpreter), shared by
    the tests below; a backend whose package is missing is registered for it."""
    out = tmp_path_factory.mktemp("bench") / "r.json"
    with pytest.MonkeyPatch.context() as mp_:
        mp_.setitem(B.REGISTRY, "NotInstalled", B.Backend("NotInstalled", "x", ("no_such_module_shmvec",),
                                                          B.REGISTRY["DummyVecEnv"].build))
        stdout = io.StringIO()
        mp_.setattr(sys, "stdout", stdout)
        rc = bench.main(["--envs", "CartPole-v1", "--n-envs", "2", "--backends", "DummyVecEnv", "ShmVecEnv",
                         "NotInstalled", "PufferLib", "--json", str(out), *TINY])
    return rc, out, stdout.getvalue()


@SB3
def test_cli_footprint_latency_and_skips(measured):
    rc, out, text = measured
    assert rc == 0
    r = json.loads(out.read_text())
    # A backend whose package is missing is a note in the table, not an error.
    reasons = {s["backend"]: s["reason"] for s in r["skipped"]}
    assert "no_such_module_shmvec is not installed" in reasons["NotInstalled"]
    assert "--puffer-python" in reasons["PufferLib"]
    assert "Skipped:" in text
    feet = {f["backend"]: f for f in r["footprint"]}
    assert set(feet) == {"DummyVecEnv", "ShmVecEnv"}
    assert feet["ShmVecEnv"]["processes"] >= 3  # the interpreter and its 2 workers (and the resource tracker)
    assert feet["DummyVecEnv"]["processes"] == 1
    for f in feet.values():
        assert f["startup_s"] > 0 and f["memory_bytes"] > 0 and f["memory_kind"] in ("pss", "rss")
        assert (f["env"], f["n_envs"]) == ("CartPole-v1", 2)
    lat = {x["backend"]: x for x in r["latency"]}
    assert set(lat) == {"DummyVecEnv", "ShmVecEnv"}
    assert all(0 < x["median_us"] <= x["p90_us"] for x in lat.values())


@SB3
def test_cli_from_json_prints_markdown(measured, capsys):
    _, out, _ = measured
    assert bench.main(["--from-json", str(out), "--markdown"]) == 0
    text = capsys.readouterr().out
    assert "| CartPole-v1 | 2 |" in text and "**" in text  # ShmVecEnv's cells stand out
    assert "| backend | median | p90 |" in text


def test_docs_results_md_is_what_the_readme_command_makes_of_results_json(capsys):
    """README: ``python -m shmvec.bench --from-json docs/results.json --markdown > docs/results.md``.
    That results file predates the ceiling, so its tables have no ceiling column."""
    docs = os.path.join(ROOT, "docs")
    if not os.path.exists(os.path.join(docs, "results.json")):
        pytest.skip("no docs/ here (an installed sdist's tests)")
    assert bench.main(["--from-json", os.path.join(docs, "results.json"), "--markdown"]) == 0
    with open(os.path.join(docs, "results.md")) as f:
        assert capsys.readouterr().out == f.read()


def test_cli_plot_writes_pngs(measured, tmp_path):
    # In a process of its own: matplotlib keeps its font files open for the life of the process.
    pytest.importorskip("matplotlib")
    _, out, _ = measured
    done = subprocess.run([sys.executable, "-m", "shmvec.bench", "--from-json", str(out), "--plot", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for name in ("throughput.png", "footprint.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
        assert name in done.stdout


def test_envpool_runs_only_its_cartpole(tmp_path, capsys):
    if B.get("EnvPool").missing():
        pytest.skip("envpool is not installed")
    out = tmp_path / "r.json"
    rc, _ = _run_cli(["--envs", "busy-10us", "--n-envs", "2", "--backends", "DummyVecEnv", "EnvPool",
                      "--no-footprint", "--no-latency", "--json", str(out), *TINY], capsys)
    assert rc == 0
    r = json.loads(out.read_text())
    assert [p["backend"] for p in r["points"]] == ["DummyVecEnv"]
    assert any(s.get("backend") == "EnvPool" and "its own envs" in s["reason"] for s in r["skipped"])


def test_cli_plot_without_matplotlib_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(SystemExit) as e:
        bench.main(["--plot", "figs", "--quiet"])
    assert e.value.code == 2
    assert "shmvec[plot]" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--envs", "NoSuchEnv"], "unknown benchmark env"),
    (["--backends", "NoSuchVecEnv"], "unknown backend"),
])
def test_cli_rejects_unknown_names(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_list(capsys):
    assert bench.main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in B.REGISTRY:
        assert name in out
    assert "busy-200us" in out


def test_presets_default_is_quick():
    args = bench._parser().parse_args([])
    config = bench.config_from_args(args)
    assert config.envs == ["CartPole-v1"] and config.n_envs == [8, 64]
    full = bench.config_from_args(bench._parser().parse_args(["--preset", "full", "--seconds", "1"]))
    assert "image-84x84x4" in full.envs and "busy-200us" in full.envs and full.seconds == 1.0


def test_progress_line_without_terminal():
    stream = io.StringIO()
    p = bench.Progress(4, stream=stream)
    p.advance("one")
    p.advance("two")
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("[  1/4]  25%") and lines[1].endswith("two")


def test_remote_helper_failure_carries_its_stderr():
    with pytest.raises(RemoteError, match="unknown backend"):
        RemoteBackend(sys.executable, "NoSuchVecEnv", B.BuildSpec("CartPole-v1", 1, 1))


def test_remote_helper_serves_chunks():
    with RemoteBackend(sys.executable, "SyncVectorEnv", B.BuildSpec("CartPole-v1", 2, 1)) as r:
        assert r.ready["startup_s"] > 0 and r.workers == 1
        assert r.chunk(0.05) > 0
        assert len(r.latency_us(5)) == 5


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_remote_helper_stops_its_backends_processes_between_requests():
    """A backend's workers that busy-wait after their chunk (PufferLib's, for half a second) would
    take a core from the backend measured next: stopped until the next request, then resumed."""
    with RemoteBackend(sys.executable, "AsyncVectorEnv", B.BuildSpec("CartPole-v1", 2, 2)) as r:
        assert r.chunk(0.05) > 0
        workers = remote_children(r.proc.pid)
        assert len(workers) >= 2 and all(_state(pid) == "T" for pid in workers), [_state(p) for p in workers]
        assert r.chunk(0.05) > 0  # resumed for the request (it would hang otherwise)
        assert all(_state(pid) == "T" for pid in workers)
    assert r.proc.returncode == 0
    for pid in workers:  # closed with them: none left, stopped or not
        with pytest.raises(FileNotFoundError):
            _state(pid)


def test_puffer_workers_leave_a_core_to_the_busy_waiting_main_process():
    assert B.puffer_workers(2, 64, n_cores=2) == 1
    assert B.puffer_workers(8, 64, n_cores=8) == 4  # 7 does not divide 64
    assert B.puffer_workers(4, 6, n_cores=16) == 3
    assert B.puffer_workers(2, 1, n_cores=1) == 1


def test_action_batches_drawn_beforehand():
    handle = B.build("DummyVecEnv", B.BuildSpec("CartPole-v1", 3, 1))
    try:
        actions = handle.sample_actions(ACTION_BATCHES)
        assert len(actions) == ACTION_BATCHES and all(a.shape == (3,) for a in actions)
        assert len({a.tobytes() for a in actions}) > 1  # random, not one batch repeated
    finally:
        handle.close()


def test_side_by_side_drops_a_failing_stepper():
    class Broken:
        def chunk(self, seconds):
            raise RuntimeError("worker died")

    class Fine:
        def chunk(self, seconds):
            return 10.0

    errors = []
    rounds = side_by_side({"ok": Fine(), "bad": Broken()}, 0.3, 3, on_error=lambda n, e: errors.append((n, str(e))))
    assert rounds == {"ok": [10.0] * 3}
    assert errors == [("bad", "worker died")]
    with pytest.raises(RuntimeError):
        side_by_side({"bad": Broken()}, 0.1, 1)


def _build_fails(spec):
    raise OSError("cannot start workers")


@SB3
def test_cli_backend_that_fails_to_build_is_a_note(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(B.REGISTRY, "Fails", B.Backend("Fails", "x", ("gymnasium",), _build_fails))
    out = tmp_path / "r.json"
    rc, cap = _run_cli(["--n-envs", "2", "--backends", "DummyVecEnv", "Fails", "--no-footprint", "--no-latency",
                        "--json", str(out), *TINY], capsys)
    assert rc == 0
    r = json.loads(out.read_text())
    assert [p["backend"] for p in r["points"]] == ["DummyVecEnv"]
    assert any(s.get("backend") == "Fails" and "OSError: cannot start workers" in s["reason"] for s in r["skipped"])
    assert "Fails (CartPole-v1 2): failed to build or step" in cap.out


@SB3
def test_cli_points_measure_only_the_pairs_given(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc, _ = _run_cli(["--points", "CartPole-v1:2", "busy-20us:1", "--backends", "DummyVecEnv", "ShmVecEnv",
                      "--no-latency", "--no-footprint", "--json", str(out), *TINY], capsys)
    assert rc == 0
    r = json.loads(out.read_text())
    assert sorted({(p["env"], p["n_envs"]) for p in r["points"]}) == [("CartPole-v1", 2), ("busy-20us", 1)]
    assert set(r["bare"]) == {"CartPole-v1", "busy-20us"}
    # start-up and memory default to the first env at its largest n_envs
    config = bench.Config(points=["CartPole-v1:2", "busy-20us:1", "CartPole-v1:8"])
    assert bench._footprint_points(config) == [("CartPole-v1", 8)]


def test_preset_targets_and_bad_points(capsys):
    config = bench.config_from_args(bench._parser().parse_args(["--preset", "targets"]))
    assert config.points == ["CartPole-v1:64", "image-84x84x4:64", "busy-200us:16"]
    # --n-envs replaces the preset's pairs
    config = bench.config_from_args(bench._parser().parse_args(["--preset", "targets", "--n-envs", "4"]))
    assert config.points is None and config.n_envs == [4]
    with pytest.raises(SystemExit):
        bench.main(["--points", "CartPole-v1"])
    assert "not ENV:N" in capsys.readouterr().err


@SB3
def test_step_timeline_stamps_every_interval():
    """bench/step_timeline.py (in a process of its own: it wraps ShmVecEnv's methods while it runs):
    every interval is there, the bodies and the period are positive, and the period holds the body."""
    root = ROOT
    done = subprocess.run([sys.executable, os.path.join("bench", "step_timeline.py"), "--n-envs", "6", "--steps", "80",
                           "--n-workers", "2", "--json"], capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["n_envs"] == 6 and out["n_workers"] == 2 and out["steps_per_s"] > 0
    assert len(out["worker_body_us"]) == 2 and len(out["post_to_worker_begin_us"]) == 2
    assert all(b > 0 for b in out["worker_body_us"]) and all(b > 0 for b in out["post_to_worker_begin_us"])
    assert out["period_us"] >= max(out["worker_body_us"]) > 0
    assert out["parent_post_us"] > 0 and out["last_end_to_wait_return_us"] > 0
    assert out["wait_return_to_step_wait_end_us"] > 0 and out["worker_skew_us"] >= 0


def _load_bench_script(name: str):
    root = ROOT
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", os.path.join(root, "bench", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lockstep_ceiling_keeps_its_processes_in_step():
    """bench/lockstep_ceiling.py: with the barrier the two processes step the same steps (one
    apart at most, the step in flight when the leader stops); without it they do not wait for
    each other; driven by the parent (round trip) each steps exactly the steps the parent posted
    (run() raises otherwise), twice in a row; every rate is positive; nothing is left behind
    (the leak fixture)."""
    lc = _load_bench_script("lockstep_ceiling")
    lock = lc.Lockstep(6, 2)
    try:
        rate = lock.run(0.3, "lockstep")
        a, b = lock.last_steps
        assert rate > 0 and a > 10 and abs(a - b) <= 1
        assert lock.run(0.3, "free") > 0 and min(lock.last_steps) > 10
        for _ in range(2):
            assert lock.run(0.3, "roundtrip") > 0
            a, b = lock.last_steps
            assert a == b > 10
    finally:
        lock.close()
    rates = lc.measure(4, 2, rounds=1, seconds=0.1)
    assert set(rates) == {"DummyVecEnv", "ShmVecEnv", "lockstep", "free", "roundtrip"}
    assert all(len(v) == 1 and v[0] > 0 for v in rates.values())


# ---------------------------------------------------------------------------------------------
# --preset scaling: steps/s against workers
# ---------------------------------------------------------------------------------------------


def test_scaling_worker_counts_and_warmup():
    from shmvec._bench.scaling import warmup_steps, worker_counts

    assert worker_counts(1) == [1]
    assert worker_counts(2) == [1, 2]
    assert worker_counts(12) == [1, 2, 4, 8, 12]
    assert worker_counts(16) == [1, 2, 4, 8, 16]
    assert warmup_steps(8) == 20 and warmup_steps(1024) == 4 and warmup_steps(100_000) == 2


def test_scaling_preset_config(capsys):
    from shmvec._bench import scaling

    def config(*argv):
        return scaling.config_from_args(bench._parser().parse_args(["--preset", "scaling", *argv]),
                                        bench.PRESETS["scaling"])

    c = config()
    assert c.envs == ["CartPole-v1", "busy-200us", "image-84x84x4"] and max(c.n_envs) >= 1024
    assert {"DummyVecEnv", "SubprocVecEnv", "AsyncVectorEnv", "ShmVecEnv", "EnvPool"} <= set(c.backends)
    assert c.process_cap == 2 * c.workers and c.seconds == 2.0
    c = config("--max-envs", "256", "--workers", "16", "--max-processes", "8", "--seconds", "0.5")
    assert c.n_envs == [64, 256] and c.workers == 16 and c.process_cap == 8 and c.seconds == 0.5
    assert config("--max-envs", "8").n_envs == [8]
    for argv, message in ((["--max-envs", "0"], "--max-envs"), (["--backends", "PufferLib"], "another interpreter")):
        with pytest.raises(SystemExit):
            bench.main(["--preset", "scaling", *argv])
        assert message in capsys.readouterr().err


@pytest.mark.timeout(60)
@SB3
def test_scaling_preset_tiny_run(tmp_path, capsys):
    """The sweep on tiny settings (a few seconds): every configuration is there, the one-process-per-env
    backend is capped and says so, ratios are consistent, and the saved results print and plot again."""
    out = tmp_path / "scaling.json"
    rc, cap = _run_cli(["--preset", "scaling", "--envs", "CartPole-v1", "--n-envs", "4", "--workers", "2",
                        "--max-processes", "2", "--backends", "DummyVecEnv", "SubprocVecEnv", "ShmVecEnv",
                        "--json", str(out), *TINY], capsys)
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["kind"] == "scaling" and r["worker_counts"] == [1, 2] and r["process_cap"] == 2
    assert r["machine"]["cpu_budget"]["chosen"] == r["machine"]["cores"] >= 1
    got = {(p["backend"], p["workers"], p["envs_stepped"], p["capped"]) for p in r["points"]}
    assert got == {("DummyVecEnv", 1, 4, False), ("SubprocVecEnv", 2, 2, True), ("ShmVecEnv", 1, 4, False),
                   ("ShmVecEnv", 2, 4, False)}
    bare = r["bare"]["CartPole-v1"]
    for p in r["points"]:
        assert p["n_envs"] == 4 and len(p["rounds"]) == 2 and p["steps_per_s"] > 0
        assert math.isclose(p["share_of_limit"], p["steps_per_s"] / (min(p["workers"], r["limit_cores"]) * bare))
        if p["backend"] == "ShmVecEnv":
            assert p["ratio_to_one_worker"] > 0 and (p["workers"] > 1 or p["ratio_to_one_worker"] == 1.0)
        else:
            assert p["ratio_to_one_worker"] is None
    assert "capped at 2 processes" in cap.out and "x 1 worker" in cap.out and "2*" in cap.out
    assert bench.main(["--from-json", str(out), "--markdown"]) == 0
    text = capsys.readouterr().out
    assert "| CartPole-v1 | 4 | SubprocVecEnv | 2 | 2 (capped) |" in text
    if importlib.util.find_spec("matplotlib") is None:
        return
    # In a process of its own: matplotlib keeps its font files open for the life of the process.
    done = subprocess.run([sys.executable, "-m", "shmvec.bench", "--from-json", str(out), "--plot", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


HAVE_MPE = all(importlib.util.find_spec(m) for m in ("pettingzoo", "mpe2"))


def test_multiagent_preset_config():
    c = bench.config_from_args(bench._parser().parse_args(["--preset", "multiagent"]))
    assert c.backends == ["ShmMultiAgentVecEnv", "SuperSuit-mp", "SuperSuit-loop"]
    assert c.points and all(p.startswith("pz-") for p in c.points)
    assert not c.footprint and not c.latency
    assert "ShmMultiAgentVecEnv" not in bench.config_from_args(bench._parser().parse_args([])).backends
    # Multi-agent envs asked for by name bring their backends; each side refuses the other's envs.
    c = bench.config_from_args(bench._parser().parse_args(["--envs", "pz-simple_spread"]))
    assert "SuperSuit-loop" in c.backends
    assert B.get("ShmVecEnv").unsupported("pz-simple_spread") == "runs single-agent envs only"
    assert "multi-agent" in B.get("SuperSuit-mp").unsupported("CartPole-v1")
    assert B.reference("pz-pistonball") == "SuperSuit-loop" and B.ours("pz-pistonball") == "ShmMultiAgentVecEnv"


@pytest.mark.skipif(not HAVE_MPE, reason="needs pettingzoo and mpe2")
@pytest.mark.timeout(120)
def test_multiagent_tiny_run(tmp_path, capsys):
    """ShmMultiAgentVecEnv beside SuperSuit (skipped with a note where it is not installed): agent steps/s,
    ratios to SuperSuit's in-process loop, and a single-agent backend refusing the env with a note."""
    out = tmp_path / "r.json"
    rc, cap = _run_cli(["--points", "pz-simple_spread:2", "--backends", "ShmMultiAgentVecEnv", "SuperSuit-mp",
                        "SuperSuit-loop", "DummyVecEnv", "--workers", "2", "--no-footprint", "--no-latency",
                        "--json", str(out), *TINY], capsys)
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["reference"] == {"pz-simple_spread": "SuperSuit-loop"}
    have_ss = importlib.util.find_spec("supersuit") is not None
    expected = {"ShmMultiAgentVecEnv", "SuperSuit-mp", "SuperSuit-loop"} if have_ss else {"ShmMultiAgentVecEnv"}
    assert {p["backend"] for p in r["points"]} == expected
    assert any(s.get("backend") == "DummyVecEnv" and "single-agent" in s["reason"] for s in r["skipped"])
    for p in r["points"]:
        assert p["steps_per_s"] > 0 and len(p["rounds"]) == 2
    if have_ss:
        assert next(p for p in r["points"] if p["backend"] == "SuperSuit-loop")["ratio_to_dummy"] == 1.0
        assert set(r["shmvec_vs"]["pz-simple_spread"]["2"]) == {"SuperSuit-mp", "SuperSuit-loop"}
        assert "ShmMultiAgentVecEnv runs" in cap.out and "agent-steps/s" in cap.out
    assert bench.main(["--from-json", str(out), "--markdown"]) == 0
    text = capsys.readouterr().out
    assert "| pz-simple_spread | 2 |" in text and "ShmMultiAgentVecEnv against each peer" in text


@pytest.mark.skipif(not HAVE_MPE, reason="needs pettingzoo and mpe2")
def test_multiagent_bare_loop_counts_agent_steps():
    from shmvec._bench.envs import AgentSteps
    from shmvec._bench.measures import env_loop_sps

    env = EnvFactory("pz-simple_spread")()
    assert isinstance(env, AgentSteps) and env.agents_per_step == 3
    assert env_loop_sps(env, 0.05) > 0


@SB3
@pytest.mark.parametrize("env", ["CartPole-v1", "image-36x36x4"])
def test_where_users_train_measures_each_situation_for_each_pair(env, tmp_path, capsys, one_torch_thread, monkeypatch):
    """Random actions, a policy in the loop, a busy core and a core busy later, for ShmVecEnv x
    DummyVecEnv and ShmVectorEnv x SyncVectorEnv: every pair has a ratio in every situation, in the
    text and markdown."""
    import torch

    from shmvec._bench import training

    monkeypatch.setattr(training, "LATER_WARM_S", 0.05)
    out = tmp_path / "r.json"
    torch.set_num_threads(2)  # torch's count as a script that sets none would have it on 2 cores
    rc, cap = _run_cli(["--envs", env, "--n-envs", "2", "--backends", "DummyVecEnv", "ShmVecEnv", "SyncVectorEnv",
                        "ShmVectorEnv", "--situations", "random", "policy", "busy", "later", "--no-footprint", "--no-latency",
                        "--json", str(out), *TINY], capsys)
    assert rc == 0
    assert torch.get_num_threads() == 2  # the run leaves torch as it found it
    r = json.loads(out.read_text())
    assert not r["skipped"], r["skipped"]
    got = {(p["situation"], p["backend"]) for p in r["training"]}
    assert got == {(s, b) for s in ("random", "policy", "busy", "later")
                   for b in ("DummyVecEnv", "ShmVecEnv", "SyncVectorEnv", "ShmVectorEnv")}
    for p in r["training"]:
        assert len(p["rounds"]) == 2 and p["steps_per_s"] > 0
        assert (p["ratio"] > 0) if p["backend"] in ("ShmVecEnv", "ShmVectorEnv") else p["ratio"] is None
    threads = {p["backend"]: p["torch_threads"] for p in r["training"] if p["situation"] == "policy"}
    assert threads["DummyVecEnv"] == 2 and threads["SyncVectorEnv"] == 2  # each at the count it has alone
    assert set(r["load"]) >= {"busy_cores_before", "steal", "warnings"}
    assert "Where users train" in cap.out and "ShmVectorEnv x SyncVectorEnv" in cap.out
    assert bench.main(["--from-json", str(out), "--markdown"]) == 0
    md = capsys.readouterr().out
    assert f"| policy | {env} | 2 |" in md and f"| busy | {env} | 2 |" in md and f"| later | {env} | 2 |" in md


def test_the_quick_preset_measures_where_users_train_at_8_and_64():
    config = bench.config_from_args(bench._parser().parse_args([]))
    assert config.training_points == ["CartPole-v1:8", "CartPole-v1:64"]
    assert config.situations == ["random", "policy", "busy", "later"]
    assert bench.config_from_args(bench._parser().parse_args(["--envs", "CartPole-v1"])).training_points is None
    assert bench.config_from_args(bench._parser().parse_args(["--situations"])).situations == []


def test_a_busy_machine_is_named_in_the_report():
    from shmvec._bench.training import machine_load

    load = machine_load()
    load.busy_cores, load.loadavg, load.steal = 1.2, 2.5, 0.12
    said = load.warnings()
    assert len(said) == 2 and "1.2 cores busy" in said[0] and "12%" in said[1]
    load.busy_cores, load.steal = 0.1, 0.01
    assert load.warnings() == []
    results = {"bare": {}, "limit_cores": 2, "points": [], "shmvec_vs": {}, "footprint": [], "latency": [],
               "skipped": [], "load": {"warnings": ["other processes kept 1.2 cores busy"]}}
    assert "WARNING: other processes kept 1.2 cores busy" in bench.format_table(results)
