"""Writes .npy files with numpy for tessel's reader test, or checks a file tessel wrote.

usage: make_numpy_fixtures.py DIR          write the fixtures
       make_numpy_fixtures.py DIR --check  check DIR/tessel_f8.npy as numpy reads it
"""
import os
import sys

import numpy as np
from numpy.lib import format as npformat


def write(path, array, version):
    with open(path, "wb") as f:
        npformat.write_array(f, array, version=version)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    if len(sys.argv) > 2 and sys.argv[2] == "--check":
        a = np.load(os.path.join(out, "tessel_f8.npy"))
        want = (np.arange(15, dtype="<f8") * 0.5).reshape(3, 5)
        if a.dtype != np.dtype("<f8") or a.shape != (3, 5) or not np.array_equal(a, want):
            print("numpy reads tessel_f8.npy wrongly:", a.dtype, a.shape, a)
            return 1
        print("numpy reads tessel's file correctly")
        return 0
    write(os.path.join(out, "f4_v1.npy"), np.arange(30, dtype="<f4").reshape(2, 3, 5), (1, 0))
    write(os.path.join(out, "f8_v2.npy"), np.arange(21, dtype="<f8").reshape(7, 3), (2, 0))
    write(os.path.join(out, "i4_v1.npy"), np.arange(11, dtype="<i4"), (1, 0))
    write(os.path.join(out, "i8_v1.npy"), np.arange(16, dtype="<i8").reshape(4, 4), (1, 0))
    write(os.path.join(out, "u1_v2.npy"), (np.arange(300) % 256).astype("u1"), (2, 0))
    print("wrote numpy fixtures to", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
