"""Shared by the Python package's tests and the C API's: the reference models (skipped, with the reason, where
they are absent) and a small model built with onnx.helper."""

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("KILN_MODELS_DIR", REPO.parent / "shared" / "models"))


def reference_model(name):
    folder = MODELS / name
    if not (folder / "model.onnx").exists():
        pytest.skip(f"reference model {name} not found at {folder} (set KILN_MODELS_DIR)")
    return folder


def saved_inputs(folder):
    manifest = json.loads((folder / "inputs" / "manifest.json").read_text())
    return {e["name"]: np.load(folder / "inputs" / e["file"]) for e in manifest}


def assert_close(got, want, what):
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} vs {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    scale = max(1.0, float(np.abs(want).max()) if want.size else 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * scale, err_msg=what)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """y = relu(x @ w + b) * scale: x float32 [batch, 8] (symbolic batch), scale float32 [1]; y [batch, 4]."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal([8, 4]).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal([4]).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"], name="matmul"),
        helper.make_node("Add", ["xw", "b"], ["xwb"], name="bias"),
        helper.make_node("Relu", ["xwb"], ["r"], name="relu"),
        helper.make_node("Mul", ["r", "scale"], ["y"], name="scale"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path_factory.mktemp("tiny") / "tiny.onnx"
    onnx.save(model, path)
    return path


def tiny_feeds(batch=3, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal([batch, 8]).astype(np.float32), "scale": np.array([0.5], np.float32)}
