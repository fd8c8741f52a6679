"""Stubs of shmvec._codec (shmvec/_codec.pyx): the info codec."""

from typing import Final

import numpy as np

INFO_CODEC_MAGIC: Final[int]

def encode_infos(obj: object, buffer: memoryview | bytearray) -> int: ...
def decode_infos(buffer: memoryview | bytes | bytearray | np.ndarray) -> object: ...
def load_result(buffer: memoryview | bytes | bytearray | np.ndarray) -> object: ...
