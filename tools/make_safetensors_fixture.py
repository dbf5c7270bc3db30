#!/usr/bin/env python3
"""Writes tests/fixtures/safetensors/python.safetensors with the Hugging Face
`safetensors` library (pip install safetensors numpy), so the suite
`safetensors` can check that a file written by the reference implementation
loads in cdphybrid. The values are simple formulas that the test recomputes.
CI does not run this; the output is committed."""
import os
import sys

import numpy as np
from safetensors.numpy import save_file

out = sys.argv[1] if len(sys.argv) > 1 else os.path.normpath(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "safetensors",
    "python.safetensors"))

tensors = {
    # names out of alphabetical order and dtypes of several sizes, so that the
    # library reorders the data section relative to the header
    "layers.1.weight": (np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5 - 1.0),
    "layers.0.bias": np.array([1.5, -2.25, 3.0], dtype=np.float32),
    "half": np.array([0.5, -1.0, 65504.0, 6.103515625e-05, 5.960464477539063e-08], dtype=np.float16),
    "ids": np.arange(-3, 3, dtype=np.int32).reshape(2, 3),
    "steps": np.array([7, 1 << 40], dtype=np.int64),
    "mask": np.array([1, 0, 255], dtype=np.uint8),
    "scalar": np.array(2.5, dtype=np.float32),
    "empty": np.zeros((0, 4), dtype=np.float32),
}
save_file(tensors, out, metadata={"format": "pt", "producer": "tools/make_safetensors_fixture.py"})
os.chmod(out, 0o644)
print(out)
