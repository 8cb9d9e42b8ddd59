"""Python CUDA clients on the simulated GPU: NVIDIA's own driver bindings
(PyPI cuda-bindings, pinned; they load libcuda.so.1 and resolve every entry
through cuGetProcAddress, no libcudart) and a ctypes client that keeps
every handle as a signed 64-bit integer, as bindings written in C do.

Run by scripts/test in .cache/venv, bare and under libvgpu.so.
"""
import ctypes
import struct
import unittest

from cuda.bindings import driver as cu

# spin(u64 ns): the PTX of conformance/sim_kernel.h.
SPIN_PTX = b""".version 7.0
.target sm_50
.address_size 64
.visible .entry spin(.param .u64 spin_ns)
{
  .reg .pred %p<2>;
  .reg .b64 %rd<6>;
  ld.param.u64 %rd1, [spin_ns];
  mov.u64 %rd2, %globaltimer;
SPIN_LOOP:
  mov.u64 %rd3, %globaltimer;
  sub.s64 %rd4, %rd3, %rd2;
  setp.lt.u64 %p1, %rd4, %rd1;
  @%p1 bra SPIN_LOOP;
  ret;
}
"""


def ok(ret):
    """Unpack a cuda-bindings result tuple, failing on an error."""
    err, *rest = ret
    if err != cu.CUresult.CUDA_SUCCESS:
        raise AssertionError(f"CUDA call failed: {err!r}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def as_signed(h):
    """A handle as a signed 64-bit integer (what C bindings store)."""
    v = int(h)
    (s,) = struct.unpack("q", struct.pack("Q", v))
    return s


class CudaBindingsOnSim(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ok(cu.cuInit(0))
        cls.dev = ok(cu.cuDeviceGet(0))
        cls.ctx = ok(cu.cuCtxCreate(0, cls.dev))

    @classmethod
    def tearDownClass(cls):
        ok(cu.cuCtxDestroy(cls.ctx))

    def test_handles_are_positive_signed_values(self):
        stream = ok(cu.cuStreamCreate(0))
        event = ok(cu.cuEventCreate(0))
        mod = ok(cu.cuModuleLoadData(SPIN_PTX))
        fn = ok(cu.cuModuleGetFunction(mod, b"spin"))
        for what, h in [("context", self.ctx), ("stream", stream), ("event", event),
                        ("module", mod), ("function", fn)]:
            s = as_signed(h)
            self.assertGreater(s, 0, f"{what} handle {int(h):#x} is negative as int64")
            self.assertEqual(s % 8, 0, f"{what} handle {int(h):#x} is not aligned")
        ok(cu.cuModuleUnload(mod))
        ok(cu.cuEventDestroy(event))
        ok(cu.cuStreamDestroy(stream))

    def test_stream_and_context_queries(self):
        least, greatest = ok(cu.cuCtxGetStreamPriorityRange())
        self.assertEqual(least, 0)
        self.assertLess(greatest, 0)
        s = ok(cu.cuStreamCreateWithPriority(cu.CUstream_flags.CU_STREAM_NON_BLOCKING, greatest))
        self.assertEqual(ok(cu.cuStreamGetPriority(s)), greatest)
        self.assertEqual(ok(cu.cuStreamGetFlags(s)), int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
        self.assertEqual(int(ok(cu.cuStreamGetCtx(s))), int(self.ctx))
        ok(cu.cuStreamDestroy(s))
        self.assertGreater(ok(cu.cuCtxGetLimit(cu.CUlimit.CU_LIMIT_STACK_SIZE)), 0)
        ok(cu.cuCtxGetCacheConfig())

    def test_bytes_round_trip_and_pointer_attributes(self):
        n = 1 << 20
        data = bytes((i * 7 + 3) & 0xFF for i in range(n))
        d = ok(cu.cuMemAlloc(n))
        ok(cu.cuMemcpyHtoD(d, data, n))
        back = bytearray(n)
        ok(cu.cuMemcpyDtoH(back, d, n))
        self.assertEqual(bytes(back), data)
        ok(cu.cuMemsetD8(d, 0x5A, 16))
        head = bytearray(16)
        ok(cu.cuMemcpyDtoH(head, d, 16))
        self.assertEqual(bytes(head), b"\x5a" * 16)
        mt = ok(cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d))
        self.assertEqual(mt, int(cu.CUmemorytype.CU_MEMORYTYPE_DEVICE))
        base, size = ok(cu.cuMemGetAddressRange(int(d) + 100))
        self.assertEqual((int(base), size), (int(d), n))
        ok(cu.cuMemFree(d))

    def test_jit_module_launch_and_events(self):
        mod = ok(cu.cuModuleLoadData(SPIN_PTX))
        fn = ok(cu.cuModuleGetFunction(mod, b"spin"))
        self.assertGreater(ok(cu.cuFuncGetAttribute(
            cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn)), 0)
        self.assertGreaterEqual(ok(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, 128, 0)), 1)
        a, b = ok(cu.cuEventCreate(0)), ok(cu.cuEventCreate(0))
        ok(cu.cuEventRecord(a, 0))
        ok(cu.cuLaunchKernel(fn, 4, 1, 1, 128, 1, 1, 0, 0, ((1_000_000,), (ctypes.c_uint64,)), 0))
        ok(cu.cuEventRecord(b, 0))
        ok(cu.cuEventSynchronize(b))
        self.assertGreaterEqual(ok(cu.cuEventElapsedTime(a, b)), 0.0)
        ok(cu.cuEventDestroy(a))
        ok(cu.cuEventDestroy(b))
        ok(cu.cuModuleUnload(mod))


class SignedHandleCtypesClient(unittest.TestCase):
    """Every handle in a c_int64, passed back as c_int64."""

    def test_context_stream_event_module_function(self):
        lib = ctypes.CDLL("libcuda.so.1")
        i64, p64 = ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)
        for name, args in {
            "cuInit": [ctypes.c_uint],
            "cuCtxCreate_v2": [p64, ctypes.c_uint, ctypes.c_int],
            "cuCtxSetCurrent": [i64],
            "cuCtxDestroy_v2": [i64],
            "cuStreamCreate": [p64, ctypes.c_uint],
            "cuStreamSynchronize": [i64],
            "cuStreamDestroy_v2": [i64],
            "cuEventCreate": [p64, ctypes.c_uint],
            "cuEventRecord": [i64, i64],
            "cuEventSynchronize": [i64],
            "cuEventDestroy_v2": [i64],
            "cuModuleLoadData": [p64, ctypes.c_char_p],
            "cuModuleGetFunction": [p64, i64, ctypes.c_char_p],
            "cuModuleUnload": [i64],
        }.items():
            getattr(lib, name).argtypes = args

        def call(name, *a):
            r = getattr(lib, name)(*a)
            self.assertEqual(r, 0, f"{name} returned {r}")

        call("cuInit", 0)
        ctx, s, e, mod, fn = (i64() for _ in range(5))
        call("cuCtxCreate_v2", ctypes.byref(ctx), 0, 0)
        call("cuStreamCreate", ctypes.byref(s), 0)
        call("cuEventCreate", ctypes.byref(e), 0)
        call("cuModuleLoadData", ctypes.byref(mod), SPIN_PTX)
        call("cuModuleGetFunction", ctypes.byref(fn), mod, b"spin")
        for what, h in [("context", ctx), ("stream", s), ("event", e), ("module", mod), ("function", fn)]:
            self.assertGreater(h.value, 0, f"{what} handle {h.value:#x} as int64")
        # Handed back as signed values, they still name the same objects.
        call("cuCtxSetCurrent", ctx)
        call("cuEventRecord", e, s)
        call("cuEventSynchronize", e)
        call("cuStreamSynchronize", s)
        call("cuModuleUnload", mod)
        call("cuEventDestroy_v2", e)
        call("cuStreamDestroy_v2", s)
        call("cuCtxDestroy_v2", ctx)


if __name__ == "__main__":
    unittest.main()
