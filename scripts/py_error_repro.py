"""The smallest call that crashed on the GPU host (LOG.md run 14): an unsupported head dim on
NumPy arrays must raise ValueError. Run under cuda-gdb there to get a backtrace if it crashes."""
import numpy as np

import warpattn

q = np.zeros((1, 16, 2, 32), np.float16)
try:
    warpattn.flash_attn_func(q, q, q)
except ValueError as e:
    print("ValueError:", e)
q = np.zeros((2, 16, 2, 64), np.float16)
try:
    warpattn.flash_attn_func(q, np.zeros((3, 16, 2, 64), np.float16), q)
except ValueError as e:
    print("ValueError:", e)
print("no crash")
