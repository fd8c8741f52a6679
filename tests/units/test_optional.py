"""shmvec without Stable-Baselines3 and torch: ``pip install shmvec`` brings neither.

The Gymnasium faces, the pool and ``ShmParallelEnv`` work; the SB3 faces raise an ImportError
that says what to install.  Checked in a fresh interpreter where an import hook hides SB3 and
torch (as a venv without them would), so that it runs here too, where they are installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from helpers import TESTS_DIR, pythonpath
from shmvec._optional import missing

HIDE = textwrap.dedent("""
    import importlib.abc, sys

    class Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("stable_baselines3", "torch", "sb3_contrib"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Hide())
""")


def run_hidden(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": pythonpath(TESTS_DIR)})


def test_the_gymnasium_faces_need_neither_sb3_nor_torch():
    out = run_hidden("""
        import sys
        import numpy as np
        import shmvec
        from shmvec import ShmEnvPool, ShmParallelEnv, ShmVectorEnv, make_env

        if __name__ == "__main__":
            envs = shmvec.make_vec("CartPole-v1", num_envs=4, vector_kwargs={"n_workers": 2, "start_method": "fork"})
            obs, _ = envs.reset(seed=0)
            obs, rew, term, trunc, _ = envs.step(np.zeros(4, dtype=np.int64))
            envs.close()
            pool = ShmEnvPool([make_env("CartPole-v1")] * 4, batch_size=2, n_workers=2, start_method="fork")
            obs, infos = pool.reset(seed=0)
            pool.close()
            assert "stable_baselines3" not in sys.modules and "torch" not in sys.modules
            print("ok", obs.shape)
    """)
    assert out.returncode == 0 and "ok (2, 4)" in out.stdout, out.stderr


@pytest.mark.parametrize("name", ["ShmVecEnv", "ShmMultiAgentVecEnv", "ShmVecEnvPool", "PoolReplayBuffer"])
def test_an_sb3_face_without_sb3_says_what_to_install(name):
    out = run_hidden(f"""
        import shmvec
        try:
            getattr(shmvec, {name!r})
        except ImportError as e:
            print(type(e).__name__, "|", e)
            print("cause:", type(e.__cause__).__name__)
        try:
            getattr(shmvec, {name!r})  # not left half-imported: the same error again
        except ImportError as e:
            print("again")
    """)
    assert out.returncode == 0, out.stderr
    assert "ModuleNotFoundError |" in out.stdout and 'pip install "shmvec[sb3]"' in out.stdout, out.stdout
    assert "cause: ModuleNotFoundError" in out.stdout and "again" in out.stdout


def test_the_bench_and_doctor_run_without_sb3():
    out = run_hidden("""
        import sys
        from shmvec import bench, doctor
        sys.exit(bench.main(["--list"]))
    """)
    assert out.returncode == 0, out.stderr


def test_missing_names_the_extra_and_leaves_other_errors_alone():
    sb3 = missing("ShmVecEnv", ModuleNotFoundError("No module named 'stable_baselines3'", name="stable_baselines3"))
    assert isinstance(sb3, ImportError) and sb3.name == "stable_baselines3"
    assert 'pip install "shmvec[sb3]"' in str(sb3) and "ShmVecEnv needs stable-baselines3" in str(sb3)
    other = ModuleNotFoundError("No module named 'shmvec._sync'", name="shmvec._sync")
    assert missing("ShmVecEnv", other) is other
