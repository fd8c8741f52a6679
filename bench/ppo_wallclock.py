"""Wall-clock time of PPO on CartPole-v1 through DummyVecEnv and ShmVecEnv, same seeds and settings.

Answers: does training get faster with shmvec, and by how much, at a given n_envs?  Both
runs must collect the same rollouts and end with the same weights (checked, printed); the
time of each run is split into rollout collection (env steps + policy forward passes) and
PPO's updates, which no vec env speeds up.  ``--busy-us`` makes each env step cost that
many extra microseconds of CPU (a stand-in for a costlier simulator than CartPole)::

    python bench/ppo_wallclock.py                          # n_envs 8, 64, 256
    python bench/ppo_wallclock.py --n-envs 64 --busy-us 50 --subproc

``--face gymnasium`` trains the CleanRL PPO of ``examples/cleanrl_ppo.py`` (``ppo.py``'s loop,
agent and defaults: ``num_steps=128``, 4 minibatches, 4 epochs, learning rate 2.5e-4; NEXT_STEP
autoreset's reset transitions masked out; the example's own GAE and update functions) through
``SyncVectorEnv`` and ``ShmVectorEnv`` (``--subproc``: ``AsyncVectorEnv`` too), each built by
``gymnasium.make_vec`` and ``shmvec.make_vec``::

    python bench/ppo_wallclock.py --face gymnasium --n-envs 16 64 --steps 65536 --repeat 2

``--torch-threads`` sets torch's threads for every run: ``default`` (torch's own count, as a
training script that does not set it: shmvec's ``parent_threads`` then decides for ShmVecEnv's
runs, as it would for the user) or a number (``1``: what a tuned script sets for everyone).  Both
can be given; each is its own table::

    python bench/ppo_wallclock.py --n-envs 16 64 --steps 32768 --repeat 2 --torch-threads default 1

The summary gives the reference's bound: its time were its env steps spread over every core at
no cost, its policy and updates as they were (a run beats it only where those ran faster, with
other torch thread counts).  Absolute
times depend on the machine (and on its load); compare the runs of one call.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
import types
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnvWrapper

import shmvec
from shmvec import ShmVecEnv
from shmvec.bench import machine


def _cleanrl() -> types.ModuleType:
    """examples/cleanrl_ppo.py: its hyperparameters (CleanRL's defaults), ``Agent``, GAE and update."""
    path = Path(__file__).resolve().parent.parent / "examples" / "cleanrl_ppo.py"
    spec = importlib.util.spec_from_file_location("cleanrl_ppo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CLEANRL = _cleanrl()


class BusyStep(gym.Wrapper):
    """Spins ``busy_us`` microseconds of CPU in every step."""

    def __init__(self, env: gym.Env, busy_us: float) -> None:
        super().__init__(env)
        self.busy_s = busy_us * 1e-6

    def step(self, action):
        end = time.perf_counter() + self.busy_s
        while time.perf_counter() < end:
            pass
        return self.env.step(action)


class StepTimer(VecEnvWrapper):
    """Adds up the wall-clock time spent inside the vec env's step (step_async + step_wait)."""

    def __init__(self, venv) -> None:
        super().__init__(venv)
        self.step_s = 0.0
        self._start = 0.0

    def reset(self):
        return self.venv.reset()

    def step_async(self, actions) -> None:
        self._start = time.perf_counter()
        self.venv.step_async(actions)

    def step_wait(self):
        out = self.venv.step_wait()
        self.step_s += time.perf_counter() - self._start
        return out


class RolloutTimer(BaseCallback):
    """Times the rollouts; notes torch's thread counts at each end (shmvec's ``parent_threads``
    may lend torch its own count through the update: runs at other counts are not compared)."""

    def __init__(self) -> None:
        super().__init__()
        self.rollout_s = 0.0
        self._start = 0.0
        self.threads: set[int] = set()

    def _on_rollout_start(self) -> None:
        self.threads.add(torch.get_num_threads())
        self._start = time.perf_counter()

    def _on_rollout_end(self) -> None:
        self.rollout_s += time.perf_counter() - self._start
        self.threads.add(torch.get_num_threads())

    def _on_step(self) -> bool:
        return True


def run(cls, n_envs: int, args: argparse.Namespace, threads: int) -> dict:
    wrapper = (lambda env: BusyStep(env, args.busy_us)) if args.busy_us > 0 else None
    kwargs = None
    if cls is ShmVecEnv:
        kwargs = {"n_workers": args.n_workers}
        if args.spin_us is not None:
            kwargs["spin_us"] = spin_option(args.spin_us)
    torch.set_num_threads(threads)  # each run starts from the count being measured
    start = time.perf_counter()
    env = make_vec_env("CartPole-v1", n_envs=n_envs, seed=0, vec_env_cls=cls, wrapper_class=wrapper,
                       vec_env_kwargs=kwargs)
    startup = time.perf_counter() - start
    env = StepTimer(env)
    try:
        model = PPO("MlpPolicy", env, n_steps=args.n_steps, batch_size=max(64, n_envs * args.n_steps // 4),
                    n_epochs=args.n_epochs, learning_rate=1e-3, seed=0, policy_kwargs={"net_arch": [64, 64]})
        timer = RolloutTimer()
        start = time.perf_counter()
        model.learn(args.steps, callback=timer)
        total = time.perf_counter() - start
        ran_threads = sorted(timer.threads | {torch.get_num_threads()})
    finally:
        env.close()
    return {"backend": cls.__name__, "n_envs": n_envs, "torch_threads": ran_threads, "steps": model.num_timesteps, "startup_s": startup,
            "total_s": total, "rollout_s": timer.rollout_s, "update_s": total - timer.rollout_s,
            "env_step_s": env.step_s, "policy_s": timer.rollout_s - env.step_s,
            "episodes": [(ep["r"], ep["l"]) for ep in model.ep_info_buffer],
            "params": [p.detach().clone() for p in model.policy.parameters()]}


def make_gymnasium(name: str, n_envs: int, args: argparse.Namespace) -> gym.vector.VectorEnv:
    wrappers = [lambda env: BusyStep(env, args.busy_us)] if args.busy_us > 0 else None
    if name == "ShmVectorEnv":
        kwargs = {"n_workers": args.n_workers}
        if args.spin_us is not None:
            kwargs["spin_us"] = spin_option(args.spin_us)
        return shmvec.make_vec("CartPole-v1", num_envs=n_envs, vector_kwargs=kwargs, wrappers=wrappers)
    mode = "sync" if name == "SyncVectorEnv" else "async"
    return gym.make_vec("CartPole-v1", num_envs=n_envs, vectorization_mode=mode, wrappers=wrappers)


def run_cleanrl(name: str, n_envs: int, args: argparse.Namespace, threads: int) -> dict:
    """The PPO of examples/cleanrl_ppo.py (CleanRL's loop and defaults) through the vec env
    ``name``; the times as :func:`run` splits them."""
    c = CLEANRL.parse_args(["--num-envs", str(n_envs), "--seed", "0"])
    num_steps = c.num_steps
    batch = n_envs * num_steps
    torch.set_num_threads(threads)
    np.random.seed(c.seed)
    torch.manual_seed(c.seed)
    start = time.perf_counter()
    envs = gym.wrappers.vector.RecordEpisodeStatistics(make_gymnasium(name, n_envs, args))
    startup = time.perf_counter() - start
    step_s = rollout_s = 0.0
    ran_threads = set()  # torch's counts at each end of each rollout (shmvec may lend it more in updates)
    try:
        obs_dim = int(np.prod(envs.single_observation_space.shape))
        agent = CLEANRL.Agent(obs_dim, int(envs.single_action_space.n))
        optimizer = torch.optim.Adam(agent.parameters(), lr=c.learning_rate, eps=1e-5)
        shape = (num_steps, n_envs)
        obs = torch.zeros(shape + (obs_dim,))
        actions = torch.zeros(shape, dtype=torch.long)
        logprobs, rewards, values, next_values = (torch.zeros(shape) for _ in range(4))
        terminated, ended, valid = (torch.zeros(shape) for _ in range(3))
        episodes: list[tuple[float, int]] = []
        next_obs = torch.as_tensor(envs.reset(seed=c.seed)[0], dtype=torch.float32)
        prev_ended = torch.zeros(n_envs)
        start = time.perf_counter()
        for _ in range(max(1, args.steps // batch)):
            ran_threads.add(torch.get_num_threads())
            rollout_start = time.perf_counter()
            for t in range(num_steps):
                obs[t] = next_obs
                valid[t] = 1.0 - prev_ended
                with torch.no_grad():
                    action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[t], actions[t], logprobs[t] = value.flatten(), action, logprob
                step_start = time.perf_counter()
                next_obs_np, reward, term, trunc, infos = envs.step(action.numpy())
                step_s += time.perf_counter() - step_start
                next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32)
                rewards[t] = torch.as_tensor(reward, dtype=torch.float32)
                terminated[t] = torch.as_tensor(term, dtype=torch.float32)
                prev_ended = torch.as_tensor(term | trunc, dtype=torch.float32)
                ended[t] = prev_ended
                with torch.no_grad():
                    next_values[t] = agent.get_value(next_obs).flatten()
                if "episode" in infos:
                    done = infos["_episode"]
                    episodes += zip(infos["episode"]["r"][done].tolist(), infos["episode"]["l"][done].tolist())
            rollout_s += time.perf_counter() - rollout_start
            ran_threads.add(torch.get_num_threads())
            advantages, returns = CLEANRL.advantages_and_returns(c, rewards, values, next_values, terminated, ended,
                                                                  valid)
            CLEANRL.update(c, agent, optimizer, obs.reshape((-1, obs_dim)), actions, logprobs, advantages, returns,
                           valid)
        total = time.perf_counter() - start
    finally:
        envs.close()
    return {"backend": name, "n_envs": n_envs, "torch_threads": sorted(ran_threads),
            "steps": max(1, args.steps // batch) * batch, "startup_s": startup,
            "total_s": total, "rollout_s": rollout_s, "update_s": total - rollout_s,
            "env_step_s": step_s, "policy_s": rollout_s - step_s, "episodes": episodes,
            "params": [p.detach().clone() for p in agent.parameters()]}


def spin_option(values: list[float]) -> float | tuple[float, float]:
    if len(values) > 2:
        raise SystemExit("--spin-us takes one number (both sides) or two (PARENT WORKER)")
    return values[0] if len(values) == 1 else (values[0], values[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--face", choices=["sb3", "gymnasium"], default="sb3",
                        help="sb3: SB3's PPO, DummyVecEnv against ShmVecEnv; gymnasium: CleanRL's PPO, "
                             "SyncVectorEnv against ShmVectorEnv (default: sb3)")
    parser.add_argument("--n-envs", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--steps", type=int, default=65_536)
    parser.add_argument("--n-steps", type=int, default=32, help="SB3's n_steps (CleanRL's loop: its own 128)")
    parser.add_argument("--n-epochs", type=int, default=2, help="SB3's n_epochs (CleanRL's loop: its own 4)")
    parser.add_argument("--busy-us", type=float, default=0.0)
    parser.add_argument("--n-workers", type=int, default=None)
    parser.add_argument("--spin-us", type=float, nargs="+", default=None, metavar="US",
                        help="shmvec's spin_us: one number for both sides, or PARENT WORKER "
                             "(default: its own); 0 makes a waiting side sleep at once")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each backend, alternating (the summary gives medians)")
    parser.add_argument("--subproc", action="store_true",
                        help="also time SubprocVecEnv (AsyncVectorEnv with --face gymnasium; slow at many envs)")
    parser.add_argument("--torch-threads", nargs="+", default=["default"], metavar="N",
                        help="torch's threads for every run: 'default' (torch's own count; shmvec's parent_threads "
                             "decides for its runs) and/or numbers; each is measured in turn (default: default)")
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args()
    if args.face == "sb3":
        backends = [DummyVecEnv, ShmVecEnv] + ([SubprocVecEnv] if args.subproc else [])
        runners = [(cls.__name__, lambda n, threads, cls=cls: run(cls, n, args, threads)) for cls in backends]
        loop = f"SB3's PPO n_steps={args.n_steps} n_epochs={args.n_epochs}"
    else:
        names = ["SyncVectorEnv", "ShmVectorEnv"] + (["AsyncVectorEnv"] if args.subproc else [])
        runners = [(name, lambda n, threads, name=name: run_cleanrl(name, n, args, threads)) for name in names]
        c = CLEANRL.parse_args([])
        loop = f"CleanRL's PPO (examples/cleanrl_ppo.py) num_steps={c.num_steps} update_epochs={c.update_epochs}"
    ref_name = runners[0][0]
    ref_short = ref_name.replace("VecEnv", "").replace("Vector", "").replace("Env", "")
    cores = machine()["cpu_budget"]["chosen"]
    default_threads = torch.get_num_threads()
    counts = [default_threads if t == "default" else int(t) for t in args.torch_threads]
    print(f"machine: {machine()}; {loop}, "
          f"{args.steps} steps, busy_us={args.busy_us}, {args.repeat} alternating runs per backend; torch threads "
          + ", ".join(f"{t} ({n})" for t, n in zip(args.torch_threads, counts)))
    header = (f"{'threads':>7s} {'backend':14s} {'n_envs':>6s} {'total s':>8s} {'rollout s':>9s} {'env step s':>10s} "
              f"{'policy s':>8s} {'update s':>8s} {'x ' + ref_short:>8s}")
    print(header + f"  same as {ref_short} (-: torch ran other thread counts)")
    rows = []
    summary = []
    for label, threads in zip(args.torch_threads, counts):
        for n_envs in args.n_envs:
            runs: dict[str, list[dict]] = {name: [] for name, _ in runners}
            for _ in range(args.repeat):
                ref = None
                for _name, runner in runners:
                    r = runner(n_envs, threads)
                    if ref is None:
                        ref = r
                    # With other torch thread counts (shmvec's parent_threads), float sums differ in
                    # their last bits and training drifts apart: nothing to compare ("-").
                    same = None if r["torch_threads"] != ref["torch_threads"] else (
                        r["episodes"] == ref["episodes"]
                        and all(torch.equal(a, b) for a, b in zip(r["params"], ref["params"])))
                    r["x_ref"] = ref["total_s"] / r["total_s"]
                    print(f"{label:>7s} {r['backend']:14s} {n_envs:6d} {r['total_s']:8.2f} {r['rollout_s']:9.2f} "
                          f"{r['env_step_s']:10.2f} {r['policy_s']:8.2f} {r['update_s']:8.2f} {r['x_ref']:8.2f}  "
                          f"{'-' if same is None else same}")
                    row = {k: v for k, v in r.items() if k not in ("params", "episodes")} | {
                        "same_as_reference": same, "reference": ref_name, "threads": label}
                    rows.append(row)
                    runs[r["backend"]].append(row)
            for name, rs in runs.items():
                med = {k: float(np.median([x[k] for x in rs])) for k in
                       ("total_s", "rollout_s", "env_step_s", "policy_s", "update_s", "x_ref")}
                summary.append({"threads": label, "backend": name, "n_envs": n_envs} | med
                               | {"x_ref_min": min(x["x_ref"] for x in rs),
                                  "x_ref_max": max(x["x_ref"] for x in rs)})
            # The bound of the env steps: the reference's run with its env steps spread over
            # every core at no cost, its policy and updates as they were.
            summary[-len(runs)]["x_ref_bound"] = float(np.median(
                [r["total_s"] / (r["total_s"] - r["env_step_s"] * (1 - 1 / cores)) for r in runs[ref_name]]))
    print(f"\nMedians of {args.repeat} runs (x {ref_short}: the median of the per-run ratios, min..max)")
    print(header)
    for m in summary:
        print(f"{m['threads']:>7s} {m['backend']:14s} {m['n_envs']:6d} {m['total_s']:8.2f} {m['rollout_s']:9.2f} "
              f"{m['env_step_s']:10.2f} "
              f"{m['policy_s']:8.2f} {m['update_s']:8.2f} {m['x_ref']:8.2f}  "
              f"({m['x_ref_min']:.2f}..{m['x_ref_max']:.2f})"
              + (f"  bound {m['x_ref_bound']:.2f}" if "x_ref_bound" in m else ""))
    print(f"bound: x {ref_short} were {ref_short}'s env steps spread over the {cores} cores at no cost, its policy "
          "and updates as they were (a run beats it only where those ran faster: torch's threads)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "args": vars(args), "rows": rows, "summary": summary}, f, indent=2)
    if any(row["same_as_reference"] is False for row in rows):
        raise SystemExit(f"a run differs from {ref_name}'s: please report it as a shmvec bug")


if __name__ == "__main__":
    main()
