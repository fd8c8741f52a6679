"""Stubs of shmvec._rows (shmvec/_rows.pyx): the hot path's C loops over numpy arrays."""

from typing import Final

import numpy as np

from shmvec._sync import Words

class RowWriter:
    slow: object
    def __init__(self, dst: np.ndarray, slow: object, at: Words | None = None, at_index: int = 0) -> None: ...
    def __call__(self, i: int, value: object) -> None: ...

ACTIONS_COPY: Final[int]
ACTIONS_RANGE: Final[int]
ACTIONS_NO_NAN: Final[int]

def copy_actions(value: object, dst: np.ndarray, check: int, start: int = ..., size: int = ...) -> bool: ...
def step_infos(terminated: np.ndarray, truncated: np.ndarray, dones: np.ndarray) -> tuple[list[dict[str, bool]], list[int]]: ...
def publish_step(rew: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, start: int,
                 rews: list, terms: list, truncs: list) -> bool: ...
