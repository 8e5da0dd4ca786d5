"""Types of the compiled pairing of dense codes (_pairs.pyx)."""

import numpy as np
import numpy.typing as npt

def match(
    left: npt.NDArray[np.int64], right: npt.NDArray[np.int64], bound: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
def locate(haystack: npt.NDArray[np.int64], needles: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]: ...
