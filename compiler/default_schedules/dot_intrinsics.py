"""The dot-product tensor intrinsics the packed contractions (compiler/dot_kernels.py) are
tensorized onto: u8 x s8 -> s32 (VNNI) and bf16 x bf16 -> f32 (AVX512-BF16).

Why our own: TVM 0.27's ``dot_16x4_vnni`` passes ``vpdpbusd`` two <16 x i32> operands, but the
LLVM inside the wheel declares the intrinsic with <64 x i8> ones: its codegen fails with "Call
parameter type does not match function signature". Same description (16 int32
lanes, each the sum of 4 u8 x s8 products), operands reinterpreted as bytes. Importing TVM's
``tensor_intrin`` package would also parse every backend's intrinsics (schedules/intrinsics.py).

bf16: ``vdpbf16ps`` takes <32 x bfloat> operands, a type TVM 0.27's codegen turns into float32
(tried here: the call then gets <32 x float>). So the operands travel as <16 x i32> and a
4-line LLVM function (BF16_LLVM) bitcasts them and calls the intrinsic; the schedule imports it
into the kernel's module with ``pragma_import_llvm``, and LLVM inlines it (TVM marks imported
functions always-inline)."""


from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ..tvmscript import top_level

VNNI_16x4 = "aotc_dot_16x4_u8i8i32_vnni"


@top_level.prim_func(s_tir=True)
def _dot_16x4_desc(A: T.Buffer((4,), "uint8", offset_factor=1),
                   B: T.Buffer((16, 4), "int8", offset_factor=1),
                   C: T.Buffer((16,), "int32", offset_factor=1)) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:4], B[0:16, 0:4])
        T.writes(C[0:16])
        for i in T.serial(0, 16):
            for k in T.serial(0, 4):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")


@top_level.prim_func(s_tir=True)
def _dot_16x4_vnni(A: T.Buffer((4,), "uint8", offset_factor=1),
                   B: T.Buffer((16, 4), "int8", offset_factor=1),
                   C: T.Buffer((16,), "int32", offset_factor=1)) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:4], B[0:16, 0:4])
        T.writes(C[0:16])
        # the 4 bytes as one int32, inline: assigned to a name, TVMScript makes it a local
        # buffer, which LowerTVMBuiltin puts in a TVMBackendAllocWorkspace call per tile
        C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
            C.vload([0], dtype="int32x16"),
            T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"), 16),
                          dtype="int8x64"),
            B.vload([0, 0], dtype="int8x64"), dtype="int32x16")


TensorIntrin.register(VNNI_16x4, _dot_16x4_desc, _dot_16x4_vnni, override=True)


BF16_16x2 = "aotc_dot_16x2_bf16f32_avx512bf16"
BF16_FUNCTION = "aotc_dpbf16ps_512"
BF16_LLVM = f"""
define <16 x float> @{BF16_FUNCTION}(<16 x float> %acc, <16 x i32> %a, <16 x i32> %b) {{
  %a16 = bitcast <16 x i32> %a to <32 x bfloat>
  %b16 = bitcast <16 x i32> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %acc, <32 x bfloat> %a16,
  <32 x bfloat> %b16)
  ret <16 x float> %r
}}
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
"""
# Every LLVM IR text a schedule of aotc's imports: a tuning record may import only these
# (schedules/trace_check.py), since imported IR is linked into the kernel as code.
TRUSTED_LLVM_IMPORTS = frozenset({BF16_LLVM})


@top_level.prim_func(s_tir=True)
def _dot_16x2_desc(A: T.Buffer((2,), "uint16", offset_factor=1),
                   B: T.Buffer((16, 2), "uint16", offset_factor=1),
                   C: T.Buffer((16,), "float32", offset_factor=1)) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:2], B[0:16, 0:2])
        T.writes(C[0:16])
        for i in T.serial(0, 16):
            for k in T.serial(0, 2):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.reinterpret(
                        "float32", T.shift_left(T.Cast("uint32", A[vk]), T.uint32(16))
                    ) * T.reinterpret(
                        "float32", T.shift_left(T.Cast("uint32", B[vi, vk]), T.uint32(16)))


@top_level.prim_func(s_tir=True)
def _dot_16x2_bf16(A: T.Buffer((2,), "uint16", offset_factor=1),
                   B: T.Buffer((16, 2), "uint16", offset_factor=1),
                   C: T.Buffer((16,), "float32", offset_factor=1)) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:2], B[0:16, 0:2])
        T.writes(C[0:16])
        C[T.ramp(T.int32(0), 1, 16)] = T.call_pure_extern(  # A inline, as above
            "float32x16", BF16_FUNCTION, C.vload([0], dtype="float32x16"),
            T.broadcast(T.reinterpret("int32", A.vload([0], "uint16x2")), 16),
            T.reinterpret("int32x16", B.vload([0, 0], dtype="uint16x32")))


TensorIntrin.register(BF16_16x2, _dot_16x2_desc, _dot_16x2_bf16, override=True)
