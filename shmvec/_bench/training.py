"""The situations users train in, measured beside the random-action figures.

Random actions on an idle machine flatter a vec env with workers: nothing else wants the cores.
Users train: between two steps the parent runs the policy, and the machine is often shared.

- ``policy``: a policy picks every action from the last observations, with torch at its default
  threads, as the loops users run do it: on the SB3 faces (``DummyVecEnv``, ``ShmVecEnv``) SB3's
  rollout loop (``obs_as_tensor``, the policy's forward pass, ``actions.cpu().numpy()``, SB3's
  ``ActorCriticPolicy``: two 64-unit tanh MLPs); on the Gymnasium faces (``SyncVectorEnv``,
  ``ShmVectorEnv``) CleanRL's loop (``torch.Tensor(obs)``, ``agent.get_action_and_value``, its
  ``Agent``: the same MLPs).  Image observations go through a small CNN (Mnih et al. 2013: 16
  8x8 filters, stride 4; 32 4x4, stride 2; 256 units), channels first, in both loops.  Each
  backend runs at the thread count it would have alone: torch's default, or what shmvec's
  ``parent_threads`` set for it (the run resets torch to its default before building each one).
- ``busy``: another process keeps one core busy (a plain spin loop) while the backends step with
  random actions, as when a second job, an evaluation or a data loader shares the machine.
  The backends are built while it runs, so that their defaults see the machine as it is.
- ``later``: the same process starts after the backends are built (a second job started after
  the first), and each backend steps ``LATER_WARM_S`` seconds beside it before the rounds: what a
  long training run gets once the machine changed under it.

Each situation pairs shmvec with the in-process reference of the same API: ``ShmVecEnv`` with
``DummyVecEnv`` and ``ShmVectorEnv`` with ``SyncVectorEnv``, in alternating rounds.

:func:`machine_load` samples what other processes do with the CPUs: before a run, the tasks they
keep running (``procs_running``, as the default ``n_workers`` does), and over the run, the time
the hypervisor stole (``/proc/stat``); the report warns when either would make the figures unfit
to compare.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

#: shmvec's backend -> the in-process reference of the same API.
PAIRS = {"ShmVecEnv": "DummyVecEnv", "ShmVectorEnv": "SyncVectorEnv"}
SB3_FACE = ("DummyVecEnv", "ShmVecEnv")
SITUATIONS = ("random", "policy", "busy", "later")
#: ``later``: seconds each backend steps beside the other process before its rounds.
LATER_WARM_S = 1.5
POLICY_SEED = 0  # every backend's policy starts from the same weights
#: Above these a run's figures are not fit to compare (the report says so).
BUSY_CORES_WARN = 0.3
STEAL_WARN = 0.05


def is_image(space: Any) -> bool:
    return getattr(space, "dtype", None) == np.uint8 and len(getattr(space, "shape", ()) or ()) == 3


def _layer(layer: Any, std: float = 2 ** 0.5) -> Any:
    """CleanRL's ``layer_init``: orthogonal weights, zero bias."""
    import torch

    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, 0.0)
    return layer


def small_cnn(channels: int, height: int, width: int) -> Any:
    """Mnih et al. (2013)'s trunk: 16 8x8 filters (stride 4), 32 4x4 (stride 2), 256 units."""
    import torch
    from torch import nn

    trunk = nn.Sequential(_layer(nn.Conv2d(channels, 16, 8, stride=4)), nn.ReLU(),
                          _layer(nn.Conv2d(16, 32, 4, stride=2)), nn.ReLU(), nn.Flatten())
    with torch.no_grad():
        n = trunk(torch.zeros(1, channels, height, width)).shape[1]
    return nn.Sequential(trunk, _layer(nn.Linear(n, 256)), nn.ReLU())


class CleanRLAgent:
    """CleanRL's PPO ``Agent`` (``ppo.py``; with :func:`small_cnn` for images): actor and critic,
    ``get_action_and_value`` sampling a Categorical (Discrete actions) or a Normal (Box)."""

    def __init__(self, obs_space: Any, action_space: Any) -> None:
        import torch
        from torch import nn

        self.image = is_image(obs_space)
        self.discrete = hasattr(action_space, "n")
        n_out = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        if self.image:
            h, w, c = obs_space.shape
            self.trunk = small_cnn(c, h, w)
            width = 256
        else:
            self.trunk = nn.Identity()
            width = int(np.prod(obs_space.shape))
        self.critic = nn.Sequential(_layer(nn.Linear(width, 64)), nn.Tanh(), _layer(nn.Linear(64, 64)), nn.Tanh(),
                                    _layer(nn.Linear(64, 1), 1.0))
        self.actor = nn.Sequential(_layer(nn.Linear(width, 64)), nn.Tanh(), _layer(nn.Linear(64, 64)), nn.Tanh(),
                                   _layer(nn.Linear(64, n_out), 0.01))
        self.logstd = nn.Parameter(torch.zeros(1, n_out))

    def get_action_and_value(self, x: Any) -> tuple:
        import torch
        from torch.distributions import Categorical, Normal

        if self.image:
            x = self.trunk(x.permute(0, 3, 1, 2) / 255.0)
        else:
            x = x.reshape(x.shape[0], -1)
        out = self.actor(x)
        dist = Categorical(logits=out) if self.discrete else Normal(out, torch.exp(self.logstd.expand_as(out)))
        action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(x)


def sb3_policy(obs_space: Any, action_space: Any) -> Any:
    """SB3's ``ActorCriticPolicy`` as PPO builds it (``MlpPolicy``); for images the same with
    :func:`small_cnn` as its features extractor, on channels-first observations."""
    from gymnasium import spaces
    from stable_baselines3.common.policies import ActorCriticPolicy
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    if not is_image(obs_space):
        policy = ActorCriticPolicy(obs_space, action_space, lambda _: 3e-4)
    else:
        h, w, c = obs_space.shape

        class SmallCNN(BaseFeaturesExtractor):
            def __init__(self, space: Any) -> None:
                super().__init__(space, 256)
                self.net = small_cnn(c, h, w)

            def forward(self, x: Any) -> Any:
                return self.net(x)

        chw = spaces.Box(0, 255, (c, h, w), np.uint8)
        policy = ActorCriticPolicy(chw, action_space, lambda _: 3e-4, features_extractor_class=SmallCNN)
    policy.set_training_mode(False)
    return policy


class PolicyLoop:
    """A stepper (``chunk(seconds)``) whose actions come from a policy, as the user's loop would
    pick them; torch runs ``threads`` threads while it steps (the count its backend has alone)."""

    def __init__(self, backend: str, step: Any, obs: Any, num_envs: int, obs_space: Any, action_space: Any,
                 threads: int) -> None:
        self.step_fn, self.obs, self.num_envs, self.threads = step, obs, num_envs, threads
        self.sb3 = backend in SB3_FACE
        self.image = is_image(obs_space)
        self.box = not hasattr(action_space, "n")
        self.low, self.high = (action_space.low, action_space.high) if self.box else (None, None)
        self.act = self._sb3_actions if self.sb3 else self._cleanrl_actions
        import torch

        # The same weights for every backend (a policy that balances longer resets less often).
        with torch.random.fork_rng():
            torch.manual_seed(POLICY_SEED)
            self.policy = sb3_policy(obs_space, action_space) if self.sb3 else CleanRLAgent(obs_space, action_space)
        self.chunk(0.0)  # one warm-up step

    def _sb3_actions(self, obs: Any) -> Any:
        import torch
        from stable_baselines3.common.utils import obs_as_tensor

        if self.image:  # what SB3's VecTransposeImage does to image observations
            obs = np.transpose(obs, (0, 3, 1, 2))
        with torch.no_grad():
            actions, _values, _log_probs = self.policy(obs_as_tensor(obs, "cpu"))
        actions = actions.cpu().numpy()
        return np.clip(actions, self.low, self.high) if self.box else actions

    def _cleanrl_actions(self, obs: Any) -> Any:
        import torch

        with torch.no_grad():
            action, _logprob, _entropy, _value = self.policy.get_action_and_value(torch.Tensor(obs))
        return action.cpu().numpy()

    def chunk(self, seconds: float) -> float:
        import torch

        torch.set_num_threads(self.threads)
        step, act = self.step_fn, self.act
        obs = self.obs
        clock = time.perf_counter
        t0 = clock()
        end = t0 + seconds
        n = 0
        while True:
            obs = step(act(obs))[0]
            n += 1
            t = clock()
            if t >= end:
                break
        self.obs = obs
        self.threads = torch.get_num_threads()  # shmvec's parent_threads may have moved it: its own next time
        return n * self.num_envs / (t - t0)


class Hog:
    """Another process that keeps one core busy (a plain spin loop) until :meth:`close`."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> Hog:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _total_and_steal() -> tuple[int, int]:
    """All CPUs' (total, steal) jiffies from ``/proc/stat``'s ``cpu`` line."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu "):
                v = [int(x) for x in line.split()[1:]]
                # user nice system idle iowait irq softirq steal (guest is inside user)
                return sum(v[:8]), (v[7] if len(v) > 7 else 0)
    raise ValueError("no cpu line in /proc/stat")


class machine_load:
    """What other processes do with the CPUs: :meth:`before` counts the tasks they keep running
    while this process sleeps (:func:`shmvec._machine.cores_taken`); :meth:`after` the share of CPU
    time the hypervisor stole since :meth:`before`.  ``warnings()`` says what makes the run's
    figures unfit to compare."""

    def __init__(self) -> None:
        self.busy_cores: float | None = None
        self.steal: float | None = None
        self.loadavg: float | None = None
        self._start: tuple[int, int] | None = None

    def before(self, seconds: float = 0.5) -> machine_load:
        from shmvec._machine import cores_taken

        try:
            self.busy_cores = cores_taken(seconds=seconds).busy
            self._start = _total_and_steal()
            self.loadavg = os.getloadavg()[0]
        except (OSError, ValueError):
            pass
        return self

    def after(self) -> machine_load:
        try:
            if self._start is not None:
                total, steal = _total_and_steal()
                total -= self._start[0]
                self.steal = round((steal - self._start[1]) / total, 3) if total > 0 else None
        except (OSError, ValueError):
            pass
        return self

    def as_dict(self) -> dict[str, Any]:
        return {"busy_cores_before": self.busy_cores, "steal": self.steal, "loadavg_before": self.loadavg,
                "warnings": self.warnings()}

    def warnings(self) -> list[str]:
        out = []
        if self.busy_cores is not None and self.busy_cores > BUSY_CORES_WARN:
            out.append(f"other processes kept {self.busy_cores:.1f} cores busy when the run started (load average "
                       f"{self.loadavg:.1f}): the figures measure a shared machine; rerun on a quiet one to compare")
        if self.steal is not None and self.steal > STEAL_WARN:
            out.append(f"the hypervisor took {100 * self.steal:.0f}% of the CPU time during the run (steal): other "
                       "guests share these cores; compare only ratios of this run, or rerun")
        return out


# ---------------------------------------------------------------------------------------------
# A point measured in every situation, and its report
# ---------------------------------------------------------------------------------------------


def measure_point(env: str, n_envs: int, names: list[str], spec: Any, situations: list[str], seconds: float,
                  rounds: int, skipped: list[dict[str, Any]], tick: Any = lambda: None) -> list[dict[str, Any]]:
    """Each backend of ``names`` (the :data:`PAIRS`) at one point, in each situation: random and
    policy in the same alternating rounds; busy in rounds of its own, the backends built again
    while a :class:`Hog` runs (so that their defaults see the machine as it is)."""
    from shmvec._bench.measures import median_ratio, side_by_side
    from shmvec._bench.session import LocalBackend, describe_error

    try:
        import torch
    except ModuleNotFoundError:  # the policies are torch's; random and busy need no torch
        torch = None
        if "policy" in situations:
            skipped.append({"backend": "policy in the loop", "env": env, "n_envs": n_envs, "situation": "policy",
                            "reason": 'the policy in the loop needs torch, which is not installed '
                                      '(pip install "shmvec[sb3]" brings it)'})
            situations = [s for s in situations if s != "policy"]

    def set_threads(n: int) -> None:
        if torch is not None:
            torch.set_num_threads(n)

    default_threads = torch.get_num_threads() if torch is not None else 1
    threads: dict[str, int] = {}
    figures: dict[str, list[float]] = {}

    def failed(key: str, e: Exception) -> None:
        situation, name = key.split("|")
        skipped.append({"backend": name, "env": env, "n_envs": n_envs, "situation": situation,
                        "reason": f"failed while stepping: {describe_error(e)}"})

    def rounds_of(quiet: bool, later: bool = False) -> None:
        """Builds every backend (each as if it were the process's only vec env), then measures
        (``later``: after a :class:`Hog` started and each backend stepped ``LATER_WARM_S`` beside it)."""
        opened: dict[str, Any] = {}
        steppers: dict[str, Any] = {}
        try:
            for name in names:
                set_threads(default_threads)
                try:
                    opened[name] = backend = LocalBackend(name, spec)
                except Exception as e:  # noqa: BLE001 - reported, the others go on
                    skipped.append({"backend": name, "env": env, "n_envs": n_envs,
                                    "reason": f"failed to build or step: {describe_error(e)}"})
                    continue
                if not quiet or later:
                    steppers[f"{'later' if later else 'busy'}|{name}"] = backend
                    continue
                threads[name] = torch.get_num_threads() if torch is not None else 1
                if "random" in situations:
                    steppers[f"random|{name}"] = backend
                if "policy" in situations:
                    venv = backend.handle.venv
                    first = backend.handle.reset()
                    steppers[f"policy|{name}"] = PolicyLoop(
                        name, backend.handle.step, first[0] if isinstance(first, tuple) else first, spec.n_envs,
                        getattr(venv, "single_observation_space", venv.observation_space),
                        getattr(venv, "single_action_space", venv.action_space), threads[name])
            if steppers and later:
                with Hog():
                    for key, stepper in list(steppers.items()):
                        try:
                            stepper.chunk(LATER_WARM_S)
                        except Exception as e:  # noqa: BLE001 - reported, the others go on
                            failed(key, e)
                            del steppers[key]
                    figures.update(side_by_side(steppers, seconds, rounds, tick, on_error=failed))
            elif steppers:
                figures.update(side_by_side(steppers, seconds, rounds, tick, on_error=failed))
        finally:
            for backend in opened.values():
                backend.close()
            set_threads(default_threads)

    if {"random", "policy"} & set(situations):
        rounds_of(quiet=True)
    if "busy" in situations:
        with Hog():
            time.sleep(0.3)  # running before the vec envs start, as a job already on the machine
            rounds_of(quiet=False)
    if "later" in situations:
        rounds_of(quiet=True, later=True)
    out: list[dict[str, Any]] = []
    for key, rounds_ in figures.items():
        situation, name = key.split("|")
        ref = PAIRS.get(name)
        ref_rounds = figures.get(f"{situation}|{ref}") if ref else None
        out.append({"situation": situation, "env": env, "n_envs": n_envs, "backend": name,
                    "steps_per_s": float(np.median(rounds_)), "rounds": rounds_,
                    "torch_threads": threads.get(name) if situation == "policy" else None,
                    "reference": ref, "ratio": median_ratio(rounds_, ref_rounds) if ref_rounds else None})
    return out


SITUATION_TITLES = {
    "random": "random actions, nothing else running",
    "policy": "a policy picks the actions (torch at its default threads)",
    "busy": "random actions, another process keeps one core busy",
    "later": "the same, the process started after the vec envs were built",
}


def ratio_rows(training: list[dict[str, Any]]) -> list[tuple[str, str, int, dict[str, float | None]]]:
    """(situation, env, n_envs, {shmvec backend: ratio to its reference}) in the order measured."""
    rows: dict[tuple[str, str, int], dict[str, float | None]] = {}
    for situation in SITUATIONS:
        for p in training:
            if p["situation"] == situation and p["backend"] in PAIRS:
                rows.setdefault((situation, p["env"], p["n_envs"]), {})[p["backend"]] = p["ratio"]
    return [(s, e, n, r) for (s, e, n), r in rows.items()]


def format_text(training: list[dict[str, Any]], ratio: Any) -> list[str]:
    """The training table, as text lines (``ratio`` formats one ratio)."""
    if not training:
        return []
    pairs = [f"{ours} x {ref}" for ours, ref in PAIRS.items()]
    lines = ["\nWhere users train (ratios of alternating rounds; above 1: shmvec is faster)",
             f"{'situation':<10}{'env':<16}{'n_envs':>7}" + "".join(f"{p:>30}" for p in pairs)]
    for situation, env, n, ratios in ratio_rows(training):
        lines.append(f"{situation:<10}{env:<16}{n:>7}" + "".join(f"{ratio(ratios.get(o)):>30}" for o in PAIRS))
    lines += [f"  {s}: {t}" for s, t in SITUATION_TITLES.items()]
    threads = sorted({(p["backend"], p["torch_threads"]) for p in training if p["torch_threads"]})
    if threads:
        lines.append("  torch threads while stepping (policy): " + ", ".join(f"{b} {t}" for b, t in threads))
    return lines


def format_markdown(training: list[dict[str, Any]], ratio: Any) -> list[str]:
    """The training table in markdown (the README's and docs/results.md's)."""
    if not training:
        return []
    out = ["", "Where users train: shmvec against the in-process vec env of the same API (median of per-round "
               "ratios, above 1: shmvec is faster); " + "; ".join(f"*{s}*: {t}" for s, t in SITUATION_TITLES.items())
           + ".", "", "| situation | env | n_envs | " + " | ".join(f"{o} x {r}" for o, r in PAIRS.items()) + " |",
           "|---|---|---:|" + "---:|" * len(PAIRS)]
    for situation, env, n, ratios in ratio_rows(training):
        out.append(f"| {situation} | {env} | {n} | " + " | ".join(ratio(ratios.get(o)) for o in PAIRS) + " |")
    return out
