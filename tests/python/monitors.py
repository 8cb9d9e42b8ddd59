"""gpustat and nvitop (PyPI, pinned in requirements.txt) against the
simulated GPU, as a user runs them: non-interactively, while a worker
process holds 512 MiB. Bare, each must exit 0 with nothing on stderr,
show the device's memory and list the worker with its memory; under
libvgpu.so with a 2 GiB budget (worker and monitor in one container: one
shared region), the same with the budget as the total.

Run by scripts/test in .cache/venv with the environment `vgpu sim env`
prints; VGPU_PRELOAD_LIB names libvgpu.so (unset: bare only).
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

MiB = 1 << 20
BIN = os.path.dirname(sys.executable)

# A CUDA process holding memory until its stdin closes.
WORKER = r"""
import ctypes, sys
lib = ctypes.CDLL("libcuda.so.1")
ctx, p = ctypes.c_void_p(), ctypes.c_uint64()
for name, *args in [("cuInit", 0), ("cuCtxCreate_v2", ctypes.byref(ctx), 0, 0),
                    ("cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(512 << 20))]:
    r = getattr(lib, name)(*args)
    if r:
        sys.exit(f"{name} returned {r}")
print("ready", flush=True)
sys.stdin.read()
"""


class Container:
    """Environment of one container: bare, or under libvgpu.so with a
    2 GiB budget and a private region."""

    def __init__(self, preload):
        self.tmp = tempfile.TemporaryDirectory()
        self.env = dict(os.environ)
        self.env.pop("LD_PRELOAD", None)
        self.env["COLUMNS"] = "120"
        self.preload = preload
        if preload:
            self.env.update(
                LD_PRELOAD=preload,
                CUDA_DEVICE_MEMORY_LIMIT="2g",
                CUDA_DEVICE_MEMORY_SHARED_CACHE=os.path.join(self.tmp.name, "vgpu.cache"),
            )

    def __enter__(self):
        self.worker = subprocess.Popen(
            [sys.executable, "-c", WORKER], env=self.env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)
        line = self.worker.stdout.readline().strip()
        if line != "ready":
            self.worker.kill()
            raise AssertionError(f"worker did not start: {line!r}")
        return self

    def __exit__(self, *exc):
        self.worker.stdin.close()
        self.worker.wait(timeout=60)
        self.worker.stdout.close()
        self.tmp.cleanup()

    def run(self, *argv):
        out = subprocess.run([os.path.join(BIN, argv[0]), *argv[1:]], env=self.env,
                             capture_output=True, text=True, timeout=120)
        return out.returncode, out.stdout, out.stderr

    @property
    def total_mib(self):
        return 2048 if self.preload else None


def modes():
    lib = os.environ.get("VGPU_PRELOAD_LIB")
    return [None] + ([lib] if lib else [])


class Monitors(unittest.TestCase):
    def each(self, check):
        for preload in modes():
            with self.subTest(preload=preload or "bare"), Container(preload) as c:
                check(c)

    def test_gpustat_json(self):
        def check(c):
            rc, out, err = c.run("gpustat", "--json")
            self.assertEqual((rc, err), (0, ""), out)
            gpu = json.loads(out)["gpus"][0]
            if c.total_mib:
                self.assertEqual(gpu["memory.total"], c.total_mib)
            else:
                self.assertGreaterEqual(gpu["memory.total"], 1024)
            self.assertGreaterEqual(gpu["memory.used"], 512)
            procs = {p["pid"]: p for p in gpu["processes"]}
            self.assertIn(c.worker.pid, procs, out)
            self.assertEqual(procs[c.worker.pid]["gpu_memory_usage"], 512)
            for key in ("temperature.gpu", "power.draw", "enforced.power.limit", "utilization.gpu"):
                self.assertIsNotNone(gpu[key], key)
        self.each(check)

    def test_gpustat_plain(self):
        def check(c):
            rc, out, err = c.run("gpustat", "--no-color", "-p")
            self.assertEqual((rc, err), (0, ""), out)
            self.assertIn(f"/{c.worker.pid}(512M)", out)
            if c.total_mib:
                self.assertIn(f"/  {c.total_mib} MB", out)
        self.each(check)

    def test_nvitop_once(self):
        def check(c):
            rc, out, err = c.run("nvitop", "-1")
            self.assertEqual((rc, err), (0, ""), out)
            self.assertNotIn("Traceback", out)
            rows = [l for l in out.splitlines() if f" {c.worker.pid} " in l]
            self.assertTrue(rows and "512.0MiB" in rows[0], out)
            if c.total_mib:
                self.assertIn(f"/ {c.total_mib}MiB", out)
            else:
                self.assertIn("/ 80.00GiB", out)
        self.each(check)


if __name__ == "__main__":
    unittest.main()
