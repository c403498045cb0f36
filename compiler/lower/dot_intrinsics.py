"""The u8 x s8 -> s32 dot-product tensor intrinsic the int8 schedule tensorizes onto.

Why our own: TVM 0.27's ``dot_16x4_vnni`` passes ``vpdpbusd`` two <16 x i32> operands, but the
LLVM inside the wheel declares the intrinsic with <64 x i8> ones: its codegen fails with "Call
parameter type does not match function signature" (tried here). Same description (16 int32
lanes, each the sum of 4 u8 x s8 products), operands reinterpreted as bytes. Importing TVM's
``tensor_intrin`` package would also parse every backend's intrinsics (~24 s)."""


from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

VNNI_16x4 = "aotc_dot_16x4_u8i8i32_vnni"


@T.prim_func(s_tir=True)
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


@T.prim_func(s_tir=True)
def _dot_16x4_vnni(A: T.Buffer((4,), "uint8", offset_factor=1),
                   B: T.Buffer((16, 4), "int8", offset_factor=1),
                   C: T.Buffer((16,), "int32", offset_factor=1)) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:4], B[0:16, 0:4])
        T.writes(C[0:16])
        a_word = T.reinterpret(A.vload([0], "uint8x4"), dtype="int32")
        C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
            C.vload([0], dtype="int32x16"),
            T.reinterpret(T.broadcast(a_word, 16), dtype="int8x64"),
            B.vload([0, 0], dtype="int8x64"), dtype="int32x16")


TensorIntrin.register(VNNI_16x4, _dot_16x4_desc, _dot_16x4_vnni, override=True)
