#!/usr/bin/env python3
"""Prints the golden tables of `ir/src/narrow.rs`'s tests (the Rust source of the `golden` module).

Every expected value comes from ONNX's own reference implementation: a one-node `Cast` model run by
`onnx.reference.ReferenceEvaluator` (Cast-25: `onnx.numpy_helper.saturate_cast`, `to_float8e8m0` and ml_dtypes'
`astype`). Re-generate after an onnx / ml_dtypes upgrade with

    .venv/bin/python scripts/gen_narrow_golden.py > /tmp/golden.rs

and paste the output over the `golden` module at the end of `ir/src/narrow.rs` (everything from its
"Golden tables" comment on). The versions used are printed in
the header so a diff shows which ones produced the table.
"""
import math
import sys

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

OPSET = 25

F32 = np.float32


def bits(x):
    return int(np.array([x], dtype=F32).view(np.uint32)[0])


def from_bits(b):
    return np.array([b], dtype=np.uint32).view(F32)[0]


def next_up(x):
    return F32(np.nextafter(F32(x), F32(np.inf)))


def next_down(x):
    return F32(np.nextafter(F32(x), F32(-np.inf)))


def run_cast(x, from_type, to_type, **attrs):
    """Runs ONNX's reference `Cast` on the 1-D array `x` (of `from_type`'s numpy dtype)."""
    node = helper.make_node("Cast", ["x"], ["y"], to=to_type, **attrs)
    graph = helper.make_graph(
        [node],
        "cast",
        [helper.make_tensor_value_info("x", from_type, [len(x)])],
        [helper.make_tensor_value_info("y", to_type, [len(x)])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    return ReferenceEvaluator(model).run(None, {"x": x})[0]


# (column name, ONNX type, mantissa bits, exponent bias) of the float types, and (name, type, signed) of the ints.
FLOATS = [
    ("F8E4M3FN", TensorProto.FLOAT8E4M3FN, 3, 7),
    ("F8E4M3FNUZ", TensorProto.FLOAT8E4M3FNUZ, 3, 8),
    ("F8E5M2", TensorProto.FLOAT8E5M2, 2, 15),
    ("F8E5M2FNUZ", TensorProto.FLOAT8E5M2FNUZ, 2, 16),
    ("F4E2M1", TensorProto.FLOAT4E2M1, 1, 1),
]
INTS = [
    ("I4", TensorProto.INT4, True),
    ("U4", TensorProto.UINT4, False),
    ("I2", TensorProto.INT2, True),
    ("U2", TensorProto.UINT2, False),
]


def float_inputs(np_dtype, m, bias):
    """Tricky f32 inputs for a narrow float type with `m` mantissa bits and exponent bias `bias`."""
    finfo = ml_dtypes.finfo(np_dtype)
    mx = F32(finfo.max)
    sub = F32(2.0 ** (1 - bias - m))  # smallest subnormal
    min_normal = F32(2.0 ** (1 - bias))
    half_ulp_at_max = F32(2.0 ** (math.floor(math.log2(float(mx))) - m - 1))
    tie_above_max = F32(mx + half_ulp_at_max)
    xs = [
        sub, sub / 2, next_up(sub / 2), next_down(sub / 2),  # ties to 0 / up to the smallest subnormal
        sub * 1.5, sub * 2.5, sub * 3,  # subnormal ties to even
        (2**m - 0.5) * sub, next_down((2**m - 0.5) * sub),  # largest subnormal + 1/2 ulp rolls into the normals
        min_normal, next_down(min_normal), next_up(min_normal),
        1.0, 1 + 2.0 ** -(m + 1), next_up(1 + 2.0 ** -(m + 1)), 1 + 3 * 2.0 ** -(m + 1),  # ties at 1
        2 - 2.0 ** -(m + 1), next_down(2 - 2.0 ** -(m + 1)),  # rounds up into the next binade
        mx, next_down(mx), next_up(mx), tie_above_max, next_down(tie_above_max), next_up(tie_above_max),
        mx * 2, 1e6, 3.4028235e38,
    ]
    return [F32(v) for v in xs]


def e8m0_inputs():
    xs = []
    for k in (-127, -126, -125, -1, 0, 1, 2, 126, 127):
        p = F32(2.0**k)
        xs += [p, next_up(p), next_down(p), F32(p * 1.5), next_up(F32(p * 1.5)), next_down(F32(p * 1.5))]
        xs += [F32(p * 1.25), F32(p * 1.75)]
    xs += [F32(2.0**-128), F32(2.0**-128 * 1.5), F32(2.0**-149), F32(3 * 2.0**-149), F32(0.124), F32(1.1)]
    xs += [F32(3.4028235e38), F32(-1.5), F32(-4.0), F32(-0.3)]
    return xs


def f4_inputs():
    vals = [0.1, 0.25, 0.2500001, 0.7499999, 0.75, 1.05, 1.25, 1.2500001, 1.75, 2.5, 2.5000002, 3.5, 4.9999995,
            5.0, 5.0000005, 6.0, 6.5, 7.0, 9.0, 100.0, 0.01, 0.48, 1e-7]
    return [F32(v) for v in vals]


def int_inputs():
    vals = [0.3, 0.5, 0.7, 1.0, 1.5, 1.99, 2.0, 2.5, 3.0, 3.5, 3.99, 4.0, 4.5, 5.5, 6.5, 7.0, 7.4, 7.5, 7.99, 8.0,
            8.5, 9.0, 14.5, 15.0, 15.49, 15.5, 15.99, 16.0, 16.5, 17.0, 100.0, 1e10, 2.0**31, 2.0**32 + 512 * 3]
    return [F32(v) for v in vals]


def specials():
    return [from_bits(b) for b in (
        0x00000000, 0x80000000,  # +-0
        0x7F800000, 0xFF800000,  # +-inf
        0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF,  # NaNs, with payloads and signs
        0x00000001, 0x00000003, 0x007FFFFF, 0x00400000, 0x00400001, 0x00600000, 0x00800000,  # f32 subnormals
        0x0D800000, 0x3F000000, 0x3EAAAAAB,  # 2^-100, 0.5, 1/3
    )]


def collect_inputs():
    xs = specials()
    for _, ty, m, bias in FLOATS:
        xs += float_inputs(helper.tensor_dtype_to_np_dtype(ty), m, bias)
    xs += e8m0_inputs() + f4_inputs() + int_inputs()
    out, seen = [], set()
    for x in xs:
        for v in (x, -x):
            b = bits(v)
            if b not in seen:
                seen.add(b)
                out.append(b)
    return out


def encode_columns(xs):
    """(column name, expected bytes) for every encoding function and mode, in the order of the Rust table."""
    cols = []
    for name, ty, _, _ in FLOATS:
        modes = (1, 0) if name.startswith("F8") else (1,)
        for sat in modes:
            y = run_cast(xs, TensorProto.FLOAT, ty, saturate=sat)
            label = name + ("" if name == "F4E2M1" else ("_SAT" if sat else "_NOSAT"))
            cols.append((label, y.view(np.uint8).tolist()))
    for sat in (1, 0):
        for mode in ("up", "down", "nearest"):
            y = run_cast(xs, TensorProto.FLOAT, TensorProto.FLOAT8E8M0, saturate=sat, round_mode=mode)
            cols.append((f"F8E8M0_{'SAT' if sat else 'NOSAT'}_{mode.upper()}", y.view(np.uint8).tolist()))
    for name, ty, signed in INTS:
        y = run_cast(xs, TensorProto.FLOAT, ty)
        y = y.astype(np.int8).view(np.uint8) if signed else y.astype(np.uint8)
        cols.append((name, y.tolist()))
    # `onnx.numpy_helper.saturate_cast` to the small ints: what QuantizeLinear-style rounding uses.
    for name, ty, signed in INTS:
        y = onnx.numpy_helper.saturate_cast(xs, helper.tensor_dtype_to_np_dtype(ty))
        y = y.astype(np.int8).view(np.uint8) if signed else y.astype(np.uint8)
        cols.append((name + "_RNE_SAT", y.tolist()))
    return cols


def decode_table(ty, n):
    np_dtype = helper.tensor_dtype_to_np_dtype(ty)
    codes = np.arange(n, dtype=np.uint8).view(np_dtype)
    y = run_cast(codes, ty, TensorProto.FLOAT)
    return y.astype(F32).view(np.uint32).tolist()


def hex_rows(values, width, per_line):
    lines = []
    for i in range(0, len(values), per_line):
        lines.append("        " + " ".join(f"0x{v:0{width}x}," for v in values[i:i + per_line]))
    return "\n".join(lines)


def main():
    inputs = collect_inputs()
    xs = np.array(inputs, dtype=np.uint32).view(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        cols = encode_columns(xs)
    w = sys.stdout.write
    w("/// Golden tables generated by `scripts/gen_narrow_golden.py` from ONNX's reference `Cast`\n")
    w(f"/// (onnx {onnx.__version__}, ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}). Do not edit by hand.\n")
    w("#[cfg(test)]\n")
    w("#[rustfmt::skip]\n")
    w("mod golden {\n")
    w("    /// The columns of [`ENCODE`], in order.\n")
    w(f"    pub const COLUMNS: [&str; {len(cols)}] = [\n")
    for i in range(0, len(cols), 6):
        w("        " + " ".join(f'"{c[0]}",' for c in cols[i:i + 6]) + "\n")
    w("    ];\n\n")
    w("    /// Rows of (f32 bits of the input, expected byte for each of [`COLUMNS`]).\n")
    w(f"    pub const ENCODE: [(u32, [u8; {len(cols)}]); {len(inputs)}] = [\n")
    for r, b in enumerate(inputs):
        row = ", ".join(f"0x{c[1][r]:02x}" for c in cols)
        w(f"        (0x{b:08x}, [{row}]),\n")
    w("    ];\n")
    for name, ty, _, _ in FLOATS:
        n = 16 if name == "F4E2M1" else 256
        w(f"\n    /// f32 bits of every {name} code, decoded.\n")
        w(f"    pub const DECODE_{name}: [u32; {n}] = [\n{hex_rows(decode_table(ty, n), 8, 8)}\n    ];\n")
    w("\n    /// f32 bits of every F8E8M0 code, decoded.\n")
    w(f"    pub const DECODE_F8E8M0: [u32; 256] = [\n{hex_rows(decode_table(TensorProto.FLOAT8E8M0, 256), 8, 8)}\n    ];\n")
    w("}\n")


if __name__ == "__main__":
    main()
