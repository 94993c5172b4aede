#!/usr/bin/env python3
"""Writes ONNX's backend node tests (model.onnx + test_data_set_0/{input,output}_N.pb per case) into a folder.

The `onnx` wheel ships the test definitions (onnx.backend.test.case.node), not the data; this runs them the way
onnx's own `backend-test-tools generate-data` does for model cases. Usage: gen_onnx_node_tests.py OUT_DIR
"""
import os
import shutil
import sys

import onnx
from onnx import TensorProto, numpy_helper
from onnx.backend.test.case import node as node_cases


def write_value(path, value, value_info):
    if not value_info.type.HasField("tensor_type"):
        return False  # sequences, maps and optionals: kiln imports tensors only, the case is skipped by `conformance`
    proto = value if isinstance(value, TensorProto) else numpy_helper.from_array(value, value_info.name)
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())
    return True


def main():
    out = sys.argv[1]
    tmp = out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    count = 0
    for case in node_cases.collect_testcases(None):
        d = os.path.join(tmp, case.name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        for i, (inputs, outputs) in enumerate(case.data_sets):
            ds = os.path.join(d, f"test_data_set_{i}")
            os.makedirs(ds, exist_ok=True)
            for j, v in enumerate(inputs):
                write_value(os.path.join(ds, f"input_{j}.pb"), v, case.model.graph.input[j])
            for j, v in enumerate(outputs):
                write_value(os.path.join(ds, f"output_{j}.pb"), v, case.model.graph.output[j])
        count += 1
    with open(os.path.join(tmp, "VERSION"), "w") as f:
        f.write(f"onnx {onnx.__version__}\n{count} cases\n")
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    print(f"wrote {count} ONNX node test cases to {out}")


if __name__ == "__main__":
    main()
