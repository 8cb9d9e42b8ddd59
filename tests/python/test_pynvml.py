"""pynvml (PyPI nvidia-ml-py, pinned) against the simulated GPU.

Run by scripts/test inside the venv it builds (.cache/venv), with the
environment `vgpu sim env` prints. The CUDA side (a context, memory, a
kernel) is driven through ctypes on the same libcuda.so.1, so this one
process is both a GPU user and an NVML observer.
Optional expectations: CONF_EXPECT_DEVICES, CONF_EXPECT_TOTAL_MEM.
"""
import ctypes
import os
import unittest

import pynvml

MiB = 1 << 20
SIM_MODULE_IMAGE = b"vgpu-sim-module v1\nkernel spin\n"


def expect(name):
    v = os.environ.get(name)
    return int(v, 0) if v else None


class Cuda:
    """Just enough of the driver API, through ctypes."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.ctx = ctypes.c_void_p()

    def call(self, name, *args):
        r = getattr(self.lib, name)(*args)
        if r != 0:
            raise RuntimeError(f"{name} returned {r}")

    def init_context(self):
        self.call("cuInit", 0)
        self.call("cuCtxCreate_v2", ctypes.byref(self.ctx), 0, 0)

    def alloc(self, size):
        p = ctypes.c_uint64()
        self.call("cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(size))
        return p.value

    def free(self, p):
        self.call("cuMemFree_v2", ctypes.c_uint64(p))

    def spin(self, blocks, block_ns):
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self.call("cuModuleLoadData", ctypes.byref(mod), ctypes.c_char_p(SIM_MODULE_IMAGE))
        self.call("cuModuleGetFunction", ctypes.byref(fn), mod, b"spin")
        ns = ctypes.c_uint64(block_ns)
        args = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(ns), ctypes.c_void_p))
        u = ctypes.c_uint
        self.call("cuLaunchKernel", fn, u(blocks), u(1), u(1), u(128), u(1), u(1), u(0),
                  ctypes.c_void_p(), args, ctypes.c_void_p())
        self.call("cuCtxSynchronize")

    def destroy(self):
        self.call("cuCtxDestroy_v2", self.ctx)


class PynvmlOnSim(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        pynvml.nvmlInit()

    @classmethod
    def tearDownClass(cls):
        pynvml.nvmlShutdown()

    def handles(self):
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def test_count(self):
        n = pynvml.nvmlDeviceGetCount()
        self.assertGreaterEqual(n, 1)
        if expect("CONF_EXPECT_DEVICES") is not None:
            self.assertEqual(n, expect("CONF_EXPECT_DEVICES"))
        with self.assertRaises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetHandleByIndex(n)

    def test_driver_versions(self):
        v = pynvml.nvmlSystemGetDriverVersion()
        self.assertRegex(v, r"^\d+\.\d+")
        self.assertGreaterEqual(pynvml.nvmlSystemGetCudaDriverVersion(), 12000)

    def test_names_uuids_indices(self):
        seen = set()
        for i, h in enumerate(self.handles()):
            self.assertEqual(pynvml.nvmlDeviceGetIndex(h), i)
            self.assertTrue(pynvml.nvmlDeviceGetName(h))
            uuid = pynvml.nvmlDeviceGetUUID(h)
            self.assertRegex(uuid, r"^GPU-[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$")
            self.assertNotIn(uuid, seen)
            seen.add(uuid)
            same = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            self.assertEqual(pynvml.nvmlDeviceGetIndex(same), i)
        with self.assertRaises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")

    def test_pci(self):
        for h in self.handles():
            pci = pynvml.nvmlDeviceGetPciInfo(h)
            bus_id = pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId
            self.assertEqual(bus_id.lower(), f"{pci.domain:08x}:{pci.bus:02x}:{pci.device:02x}.0")

    def test_memory(self):
        for h in self.handles():
            m = pynvml.nvmlDeviceGetMemoryInfo(h)
            self.assertEqual(m.used + m.free, m.total)
            if expect("CONF_EXPECT_TOTAL_MEM") is not None:
                self.assertEqual(m.total, expect("CONF_EXPECT_TOTAL_MEM"))
            m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            self.assertEqual(m2.total, m.total)
            self.assertEqual(m2.reserved + m2.used + m2.free, m2.total)

    def test_process_list_and_utilization(self):
        h = self.handles()[0]
        me = os.getpid()
        pids = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
        self.assertNotIn(me, pids, "listed before holding a context")
        cuda = Cuda()
        cuda.init_context()
        try:
            p = cuda.alloc(200 * MiB)
            procs = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
            self.assertIn(me, procs)
            self.assertGreaterEqual(procs[me], 200 * MiB)
            used = pynvml.nvmlDeviceGetMemoryInfo(h).used
            self.assertGreaterEqual(used, 200 * MiB)

            sms = ctypes.c_int()
            cuda.call("cuDeviceGetAttribute", ctypes.byref(sms), 16, 0)  # SM count
            cuda.spin(4 * sms.value, 50_000_000)  # ~200 ms of device time
            u = pynvml.nvmlDeviceGetUtilizationRates(h)
            self.assertGreater(u.gpu, 0)
            self.assertLessEqual(u.gpu, 100)
            samples = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
            mine = [s for s in samples if s.pid == me]
            self.assertTrue(mine, f"no utilization sample for pid {me}: {samples}")
            self.assertGreater(max(s.smUtil for s in mine), 0)
            cuda.free(p)
        finally:
            cuda.destroy()
        pids = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
        self.assertNotIn(me, pids, "still listed after its context is gone")


if __name__ == "__main__":
    unittest.main()
