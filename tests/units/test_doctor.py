"""``shmvec doctor``: each check's verdict on given inputs, and the command on this machine."""

from __future__ import annotations

import importlib.util

import json
import multiprocessing as mp
import os
import subprocess
import sys
import time

import pytest

from helpers import SB3
from shmvec import doctor


def test_cores_more_workers_than_cores_warns():
    c = doctor.check_cores(workers=4, cores=2, load=0.0)
    assert c.status == "warn" and "n_workers <= 2" in c.advice


def test_cores_fit():
    c = doctor.check_cores(workers=2, cores=2, load=0.5)
    assert c.status == "ok" and "2 workers fit" in c.detail


def test_cores_busy_machine_warns():
    c = doctor.check_cores(workers=2, cores=2, load=7.0)
    assert c.status == "warn" and "quiet machine" in c.advice


def test_cores_other_busy_processes_warn():
    c = doctor.check_cores(workers=2, cores=2, load=0.2, busy=1.0)
    assert c.status == "warn" and "1.0 busy now" in c.detail and "DummyVecEnv" in c.advice
    assert doctor.check_cores(workers=2, cores=2, load=0.2, busy=0.1).status == "ok"
    # a load average left by a run that has ended does not outweigh the sample
    assert doctor.check_cores(workers=2, cores=2, load=7.0, busy=0.1).status == "ok"


def test_busy_cores_sees_a_busy_process():
    """A child spinning on one of this process's cores shows up as (most of) a busy core."""
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 5: pass"])
    try:
        time.sleep(0.2)
        busy = doctor.busy_cores(0.5)
    finally:
        child.kill()
        child.wait()
    assert busy is not None and 0.5 <= busy <= doctor._cores() + 0.01


def test_cores_single_core_warns():
    c = doctor.check_cores(workers=None, cores=1, load=0.0)
    assert c.status == "warn" and "DummyVecEnv" in c.advice


def test_shm_roomy_directory_is_ok(tmp_path):
    c = doctor.check_shm(needed_bytes=4096, directory=str(tmp_path))
    assert c.status in ("ok", "warn")  # warn only if tmp_path's filesystem is small
    assert c.data["free_bytes"] > 0 and c.data["needed_bytes"] == 4096


def test_shm_not_enough_room_fails(tmp_path):
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    c = doctor.check_shm(needed_bytes=free + 2**30, directory=str(tmp_path))
    assert c.status == "fail" and "--shm-size" in c.advice


def test_shm_missing_directory_fails(tmp_path):
    c = doctor.check_shm(directory=str(tmp_path / "nope"))
    assert c.status == "fail" and "tmpfs" in c.advice


def _dead_pid() -> int:
    p = mp.get_context("fork").Process(target=int)
    p.start()
    p.join()
    return p.pid


def test_shm_stale_segments_are_found(tmp_path):
    dead = _dead_pid()
    (tmp_path / f"shmvec_{dead}_abcd").write_bytes(b"x")
    (tmp_path / f"shmvec_{os.getpid()}_ef01").write_bytes(b"x")  # ours, alive: not stale
    (tmp_path / "other_segment").write_bytes(b"x")
    assert doctor.stale_segments(str(tmp_path)) == [f"shmvec_{dead}_abcd"]
    c = doctor.check_shm(directory=str(tmp_path))
    assert c.status == "warn" and f"rm {tmp_path}/shmvec_{dead}_abcd" in c.advice


def test_start_method():
    c = doctor.check_start_method()
    assert c.status == "ok" and c.data["shmvec_default"] in ("forkserver", "spawn")
    assert doctor.check_start_method("fork").status == "info"
    assert doctor.check_start_method("spawn").status == "info"
    assert doctor.check_start_method("no-such-method").status == "fail"


def test_threads_too_many_warns():
    c = doctor.check_threads({"OMP_NUM_THREADS": "64", "MKL_NUM_THREADS": "1"}, cores=2, workers=2)
    assert c.status == "warn" and "OMP_NUM_THREADS=64" in c.detail and "MKL" not in c.detail


def test_threads_unset_advises_for_other_vec_envs():
    c = doctor.check_threads({}, cores=4, workers=3)
    assert c.status == "ok" and "OMP_NUM_THREADS=1" in c.advice and "torch.set_num_threads(1)" in c.advice


def test_predicted_speedup_and_envs_needed():
    # A 1 us env with a 30 us round trip: DummyVecEnv wins at 8 envs on 2 workers.
    assert doctor.predict_speedup(1e-6, 8, 2, 30e-6) < 1
    # A 200 us env: nearly 2x on 2 workers.
    assert doctor.predict_speedup(200e-6, 16, 2, 30e-6) > 1.9
    need = doctor.envs_per_worker_needed(1e-6, 2, 30e-6)
    assert doctor.predict_speedup(1e-6, 2 * need, 2, 30e-6) >= doctor.WORTH_IT
    assert doctor.predict_speedup(1e-6, 2 * (need - 1), 2, 30e-6) < doctor.WORTH_IT
    assert doctor.envs_per_worker_needed(1e-6, 1, 30e-6) is None


def test_env_check_times_a_real_env():
    c = doctor.check_env("busy-2000us", n_envs=4, workers=2, seconds=0.1)
    assert c.data["step_us"] >= 2000  # the env burns 2 ms of CPU per step
    assert c.data["roundtrip_us"] > 0
    assert c.status == "ok"  # 2 ms per step dwarfs any round trip


def test_env_check_cheap_env_on_one_worker_warns():
    c = doctor.check_env("zero-cost", n_envs=4, workers=1, seconds=0.1)
    assert c.status == "warn" and "DummyVecEnv" in c.advice and "at least 2 workers" in c.advice


def test_diagnose_unbuildable_env_fails():
    checks = doctor.diagnose(env="NoSuchEnv-v0", n_envs=2)
    env = [c for c in checks if c.name == "env"]
    assert env and env[0].status == "fail" and "NoSuchEnv-v0" in env[0].detail


def test_cli_json(capsys):
    rc = doctor.main(["--env", "CartPole-v1", "--n-envs", "4", "--workers", "2", "--json"])
    checks = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in checks] == ["cores", "shm", "start-method", "threads", "parent-threads",
                                           "placement", "env"]
    assert rc == 0
    shm = checks[1]
    assert shm["data"]["needed_bytes"] > 0
    assert checks[6]["data"]["predicted_speedup"] > 0


def test_cli_measure_text(capsys):
    rc = doctor.main(["--env", "busy-300us", "--n-envs", "4", "--workers", "2", "--measure"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith("shmvec doctor:") and "measured" in out and "[" in out


@SB3
@pytest.mark.parametrize("env_id", ["Acrobot-v1"])
def test_cli_measure_gymnasium_id(env_id, capsys):
    assert doctor.main(["--env", env_id, "--n-envs", "2", "--measure", "--json"]) == 0
    checks = json.loads(capsys.readouterr().out)
    measured = checks[-1]["data"]["measured"]
    assert measured["DummyVecEnv"] > 0 and measured["ShmVecEnv"] > 0


@pytest.mark.skipif(importlib.util.find_spec("stable_baselines3") is not None, reason="checks an install without SB3")
def test_cli_measure_without_sb3_says_why_it_did_not(capsys):
    assert doctor.main(["--env", "Acrobot-v1", "--n-envs", "2", "--measure", "--json"]) == 0
    check = json.loads(capsys.readouterr().out)[-1]
    assert "measured" not in check["data"] and 'pip install \\"shmvec[sb3]\\"' in json.dumps(check["detail"]), check


def _quota_budget():
    from shmvec._machine import CpuBudget

    return CpuBudget(logical=16, affinity=16, physical=8, quota=2.5, quota_source="cgroup v2, /sys/fs/cgroup/job/cpu.max",
                     chosen=2, reason="the cgroup CPU quota of 2.5 CPUs, rounded down: a worker never waits for the "
                                      "quota to refill, and the fraction left is the parent's")


def test_cores_reports_the_budget_and_why():
    """The cores check says what the CPU budget found (CPUs, physical cores, quota) and why it chose."""
    budget = _quota_budget()
    c = doctor.check_cores(workers=None, load=0.1, budget=budget)
    assert c.status == "ok" and c.data["cores"] == 2 and c.data["budget"]["quota"] == 2.5
    for part in ("16 CPUs in this process's affinity (of 16 online)", "8 physical cores", "quota of 2.5 CPUs",
                 "/sys/fs/cgroup/job/cpu.max", "default n_workers 2", "rounded down"):
        assert part in c.detail, c.detail
    c = doctor.check_cores(workers=8, load=0.1, budget=budget)
    assert c.status == "warn" and "n_workers <= 2" in c.advice


def test_cli_text_prints_the_budget(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "cpu_budget", _quota_budget)
    monkeypatch.setattr(doctor, "busy_cores", lambda seconds=0.3: 0.0)
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("shmvec doctor: 16 CPUs (8 physical cores),")
    assert "quota of 2.5 CPUs" in out and "default n_workers 2: the cgroup CPU quota" in out
    monkeypatch.setattr(doctor, "cpu_budget", _quota_budget)
    assert doctor.main(["--json"]) == 0
    cores = json.loads(capsys.readouterr().out)[0]
    assert cores["name"] == "cores" and cores["data"]["budget"]["chosen"] == 2


def test_placement_says_whether_the_workers_are_placed():
    from shmvec._placement import plan

    c = doctor.check_placement(1)
    assert c.status == "ok" and "one worker" in c.detail and not c.data["trials"]
    workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2
    c = doctor.check_placement(workers)
    assert c.data["trials"] == plan(workers, {}, 0).on and c.data["why"] in c.detail
    if c.data["trials"]:
        assert "cpu_affinity=False" in c.advice


def test_parent_threads_says_what_shmvec_will_set():
    c = doctor.check_parent_threads(8, cores=8, workers=8, environ={})
    assert c.status == "ok" and "sets it to 1" in c.detail and "parent_threads=None" in c.advice
    assert "times lending torch its 8 threads" in c.detail  # through PPO's updates (shmvec._threads, "Lending")
    c = doctor.check_parent_threads(2, cores=8, workers=4, environ={})
    assert "leaves them as they are" in c.detail
    c = doctor.check_parent_threads(8, cores=8, workers=8, environ={"OMP_NUM_THREADS": "8"})
    assert c.status == "warn" and "torch.set_num_threads(1)" in c.advice
    c = doctor.check_parent_threads(None, cores=8, workers=8, environ={})
    assert "not installed" in c.detail
    if importlib.util.find_spec("torch") is None:
        assert doctor.torch_default_threads() is None
    else:
        assert doctor.torch_default_threads() >= 1
