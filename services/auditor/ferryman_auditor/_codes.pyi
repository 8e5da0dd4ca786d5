"""Types of the compiled content coder (_codes.pyx)."""

import numpy as np
import numpy.typing as npt

def content_codes(
    n: int,
    key_valid: npt.NDArray[np.uint8] | None,
    key_offs: npt.NDArray[np.int32] | npt.NDArray[np.int64],
    key_data: npt.NDArray[np.uint8],
    value_valid: npt.NDArray[np.uint8] | None,
    value_offs: npt.NDArray[np.int32] | npt.NDArray[np.int64],
    value_data: npt.NDArray[np.uint8],
    headers_valid: npt.NDArray[np.uint8] | None,
    headers_offs: npt.NDArray[np.int32] | npt.NDArray[np.int64],
    name_offs: npt.NDArray[np.int32] | npt.NDArray[np.int64],
    name_data: npt.NDArray[np.uint8],
    hvalue_valid: npt.NDArray[np.uint8] | None,
    hvalue_offs: npt.NDArray[np.int32] | npt.NDArray[np.int64],
    hvalue_data: npt.NDArray[np.uint8],
    timestamps: npt.NDArray[np.int64],
    types: npt.NDArray[np.int32],
    skip_name: bytes,
    hash_mask: int = ...,
) -> npt.NDArray[np.int64]: ...
