"""The card's peak memory bandwidth as device_info's memory_bandwidth_gbps computes it (memory
clock x bus width; the decode split floor, decode_plan.hpp's cache_bandwidth_ctas, is by it):
the H100 80GB prints 3352 (run 227); an H200 is expected at ~4800 (6144 bits), not yet printed.
    python3 scripts/print_memory_bandwidth.py
"""
import ctypes, glob, torch
p = torch.cuda.get_device_properties(0)
print("torch props:", {k: getattr(p, k) for k in ("name", "memory_clock_rate", "memory_bus_width") if hasattr(p, k)})
for lib in ["libcudart.so"] + glob.glob("/usr/local/cuda/lib64/libcudart.so*"):
    try:
        rt = ctypes.CDLL(lib); break
    except OSError: rt = None
if rt:
    v = ctypes.c_int()
    rt.cudaDeviceGetAttribute(ctypes.byref(v), 36, 0); khz = v.value
    rt.cudaDeviceGetAttribute(ctypes.byref(v), 37, 0); bits = v.value
    print("memoryClockRate kHz", khz, "bus bits", bits, "memory_bandwidth_gbps", khz * bits // 4 // 1000000)
