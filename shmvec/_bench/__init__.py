"""The benchmark's parts, shared by ``python -m shmvec.bench`` and the pytest-benchmark files in ``bench/``.

- :mod:`shmvec._bench.envs`: the envs, by name;
- :mod:`shmvec._bench.backends`: the vec envs compared (one registry entry each);
- :mod:`shmvec._bench.measures`: steps/s, side-by-side rounds, latency, memory;
- :mod:`shmvec._bench.remote`: a backend measured in a helper process (fresh or foreign interpreter);
- :mod:`shmvec._bench.session`: what every run shares (the machine, the progress line, a backend as a stepper);
- :mod:`shmvec._bench.scaling`: ``--preset scaling``, steps/s against workers;
- :mod:`shmvec._bench.plot`: the PNG figures (needs ``shmvec[plot]``).

This package imports nothing heavy at import time, so helper processes in other interpreters can use it.
"""
