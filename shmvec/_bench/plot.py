"""The benchmark's figures as PNG (matplotlib, from the ``shmvec[plot]`` extra).

- ``throughput.png``: env steps/s against ``n_envs`` (log-log), one panel per env, one line per
  backend, the limit (cores x one env's bare-loop steps/s) drawn dashed;
- ``footprint.png``: start-up time (construct + first reset) and memory added, one bar per backend;
- ``scaling.png`` (``--preset scaling``): env steps/s against workers (log-log), one panel per env
  and ``n_envs``, a line per backend that takes a number of workers, a marker for each of the
  others at its number of processes, and the limit (min(workers, cores) x one env's bare loop).
"""

from __future__ import annotations

import os
from typing import Any

PLOT_HINT = 'plots need matplotlib: pip install "shmvec[plot]" (or pip install matplotlib)'

# One colour per backend, the same in every figure; shmvec's backends stand out.
_COLORS = {
    "ShmVecEnv": "#d62728", "ShmVectorEnv": "#ff7f0e", "DummyVecEnv": "#1f77b4", "SubprocVecEnv": "#9467bd",
    "SyncVectorEnv": "#17becf", "AsyncVectorEnv": "#8c564b", "EnvPool": "#2ca02c", "PufferLib": "#e377c2", "ShmEnvPool": "#bcbd22",
}

_LABELS = {"EnvPool": "EnvPool (its C++ CartPole)"}


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ImportError(PLOT_HINT) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _subtitle(results: dict[str, Any]) -> str:
    m = results["machine"]
    c = results["config"]
    return (f"{m['cores']} cores, {m['cpu']}, Python {m['python']}; {c['seconds']:g} s per point, "
            f"{c['workers']} workers, start method {c['start_method']}")


def plot_throughput(results: dict[str, Any], path: str) -> str:
    plt = _pyplot()
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    envs = list(results["bare"])
    cols = min(3, len(envs))
    rows = (len(envs) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols + 2.9, 3.8 * rows + 0.8), squeeze=False)
    legend: dict[str, Any] = {}
    for ax, env in zip(axes.flat, envs):
        points = [p for p in results["points"] if p["env"] == env]
        for backend in dict.fromkeys(p["backend"] for p in points):
            mine = sorted((p["n_envs"], p["steps_per_s"]) for p in points if p["backend"] == backend)
            xs, ys = zip(*mine)
            shm = backend.startswith("Shm")
            (line,) = ax.plot(xs, ys, marker="o", lw=2.6 if shm else 1.4, color=_COLORS.get(backend),
                              zorder=3 if shm else 2)
            legend.setdefault(_LABELS.get(backend, backend), line)
        line = ax.axhline(results["limit"][env], ls="--", color="black", lw=1.2)
        legend.setdefault(f"limit: {results['limit_cores']} cores x one env in a bare loop", line)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ns = sorted({p["n_envs"] for p in points})
        ax.xaxis.set_major_locator(FixedLocator(ns))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_title(env, fontsize=11)
        ax.set_xlabel("n_envs")
        ax.set_ylabel("env steps / s")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(envs):]:
        ax.axis("off")
    fig.legend(list(legend.values()), list(legend), loc="center right", fontsize=8, frameon=False)
    fig.suptitle("Env steps/s against n_envs (log-log)\n" + _subtitle(results), fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - 2.8 / fig.get_figwidth(), 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_footprint(results: dict[str, Any], path: str) -> str:
    plt = _pyplot()
    rows = results["footprint"]
    groups = list(dict.fromkeys((r["env"], r["n_envs"]) for r in rows))
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 0.45 * 8 + 0.35 * len(rows)), squeeze=False)
    for (env, n_envs), (ax_t, ax_m) in zip(groups, axes):
        mine = [r for r in rows if (r["env"], r["n_envs"]) == (env, n_envs)]
        names = [r["backend"] for r in mine]
        colors = [_COLORS.get(n, "gray") for n in names]
        ax_t.barh(names, [r["startup_s"] for r in mine], color=colors)
        ax_t.set_xlabel("seconds: construct + first reset")
        ax_t.set_title(f"start-up, {env} x {n_envs}")
        ax_m.barh(names, [r["memory_added_bytes"] / 2**20 for r in mine], color=colors)
        ax_m.set_xlabel(f"MiB added ({mine[0]['memory_kind'].upper()} of all processes, after - before)")
        ax_m.set_title(f"memory, {env} x {n_envs}")
        for ax in (ax_t, ax_m):
            ax.margins(x=0.12)  # room for the value labels
            ax.invert_yaxis()
            ax.grid(True, axis="x", alpha=0.3)
        for i, r in enumerate(mine):
            ax_t.text(r["startup_s"], i, f" {r['startup_s']:.2f}", va="center", fontsize=8)
            ax_m.text(r["memory_added_bytes"] / 2**20, i, f" {r['memory_added_bytes'] / 2**20:.0f}", va="center",
                      fontsize=8)
    fig.suptitle("Start-up and memory, each backend in a fresh interpreter\n" + _subtitle(results), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_scaling(results: dict[str, Any], path: str) -> str:
    plt = _pyplot()
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    envs = list(results["bare"])
    ns = sorted({p["n_envs"] for p in results["points"]}) or [0]
    fig, axes = plt.subplots(len(envs), len(ns), figsize=(4.2 * len(ns) + 2.9, 3.5 * len(envs) + 1.0), squeeze=False)
    legend: dict[str, Any] = {}
    cap = results["process_cap"]
    for row, env in zip(axes, envs):
        for ax, n in zip(row, ns):
            points = [p for p in results["points"] if (p["env"], p["n_envs"]) == (env, n)]
            xs_all = sorted({p["workers"] for p in points} | set(results["worker_counts"]))
            for backend in dict.fromkeys(p["backend"] for p in points):
                mine = sorted((p["workers"], p["steps_per_s"]) for p in points if p["backend"] == backend)
                xs, ys = zip(*mine)
                shm = backend.startswith("Shm")
                label = _LABELS.get(backend, backend)
                if any(p["capped"] for p in points if p["backend"] == backend):
                    label = f"{backend} (one process per env, at most {cap}: * steps {cap} envs)"
                (line,) = ax.plot(xs, ys, marker="o" if len(xs) > 1 else "s", lw=2.6 if shm else 1.4,
                                  color=_COLORS.get(backend), zorder=3 if shm else 2, ms=7 if len(xs) == 1 else 5)
                legend.setdefault(label, line)
                for p in points:
                    if p["backend"] == backend and p["capped"]:
                        ax.annotate("*", (p["workers"], p["steps_per_s"]), textcoords="offset points", xytext=(4, 2))
            bare, k = results["bare"][env], results["limit_cores"]
            (line,) = ax.plot(xs_all, [min(x, k) * bare for x in xs_all], ls="--", color="black", lw=1.2)
            legend.setdefault(f"limit: min(workers, {k} cores) x one env in a bare loop", line)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.xaxis.set_major_locator(FixedLocator(xs_all))
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_title(f"{env}, {n} envs", fontsize=10)
            ax.set_xlabel("workers (processes or threads)")
            ax.set_ylabel("env steps / s")
            ax.grid(True, which="both", alpha=0.3)
    fig.legend(list(legend.values()), list(legend), loc="center right", fontsize=8, frameon=False)
    m = results["machine"]
    c = results["config"]
    fig.suptitle(f"Env steps/s against workers (log-log)\n{m['cores']} cores, {m['cpu']}, Python {m['python']}; "
                 f"{c['seconds']:g} s per configuration, start method {c['start_method']}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - 2.8 / fig.get_figwidth(), 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(results: dict[str, Any], directory: str) -> list[str]:
    """Writes the figures into ``directory`` (created if needed); returns their paths."""
    os.makedirs(directory, exist_ok=True)
    if results.get("kind") == "scaling":
        return [plot_scaling(results, os.path.join(directory, "scaling.png"))]
    out = [plot_throughput(results, os.path.join(directory, "throughput.png"))]
    if results.get("footprint"):
        out.append(plot_footprint(results, os.path.join(directory, "footprint.png")))
    return out
