"""An ONNX Runtime script of the usual shape, run by kiln: the only change from the ONNX Runtime original is the
import line (``import onnxruntime as ort`` became ``import kiln as ort``).

    python examples/python/ort_style.py MODEL.onnx [--batch N]

It creates a session, reads the input metadata, builds random feeds with NumPy (symbolic dims get --batch), runs
the model and post-processes the first output: a softmax over its last axis and the top five classes of each row.
"""

import argparse

import numpy as np

import kiln as ort

NUMPY_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(args.model, sess_options=options, providers=["CPUExecutionProvider"])

    rng = np.random.default_rng(0)
    feeds = {}
    for arg in session.get_inputs():
        shape = [d if isinstance(d, int) else args.batch for d in arg.shape]
        dtype = NUMPY_TYPES[arg.type]
        if np.issubdtype(dtype, np.floating):
            feeds[arg.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[arg.name] = rng.integers(0, 2, shape).astype(dtype)
        print(f"input {arg.name}: {arg.type} {arg.shape}")

    output_names = [o.name for o in session.get_outputs()]
    outputs = session.run(output_names, feeds)

    logits = outputs[0].reshape(-1, outputs[0].shape[-1]).astype(np.float64)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    for row, p in enumerate(probs):
        top = np.argsort(-p)[:5]
        print(f"row {row}: top5 {top.tolist()} p={np.round(p[top], 4).tolist()}")


if __name__ == "__main__":
    main()
