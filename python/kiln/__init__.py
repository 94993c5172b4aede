"""kiln: a tensor-graph compiler toolchain, from Python.

The API has ONNX Runtime's shape, so a script that creates a session, reads its input metadata, builds feeds with
NumPy and runs it works with ``import kiln as ort`` and ``kiln.InferenceSession``::

    import numpy as np
    import kiln

    session = kiln.InferenceSession("model.onnx")
    x = session.get_inputs()[0]
    (y,) = session.run(None, {x.name: np.zeros([1, 3, 224, 224], np.float32)})

Beyond ONNX Runtime: :func:`compile` writes an ahead-of-time artifact, :func:`load` runs one without the compiler,
:func:`check` lists what a model uses that kiln does not support, and :meth:`InferenceSession.generate` runs greedy
generation over a key/value-cache step model. ``docs/python.md`` in the kiln repository is the guide; it lists what
of ONNX Runtime's API is here and what differs.
"""

from ._kiln import (
    ExecutionError,
    FallbackWarning,
    Generation,
    InferenceSession,
    InvalidInput,
    InvalidModel,
    KilnError,
    NodeArg,
    Unsupported,
    __version__,
    check,
    compile,
    load,
    supported_ops,
)

__all__ = [
    "ExecutionError",
    "FallbackWarning",
    "Generation",
    "InferenceSession",
    "InvalidInput",
    "InvalidModel",
    "KilnError",
    "NodeArg",
    "SessionOptions",
    "Unsupported",
    "__version__",
    "check",
    "compile",
    "get_available_providers",
    "load",
    "supported_ops",
]


class SessionOptions:
    """ONNX Runtime's session options, the part kiln reads: ``intra_op_num_threads`` (0: all cores).

    The other attributes ONNX Runtime scripts set are accepted and have no effect: kiln always optimizes fully
    (``graph_optimization_level``) and runs one model invocation at a time per call (``execution_mode``).
    """

    def __init__(self) -> None:
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.graph_optimization_level = None
        self.execution_mode = None
        self.log_severity_level = 2


def get_available_providers() -> list:
    """The ONNX Runtime provider names kiln maps to its backends."""
    return ["CUDAExecutionProvider", "CPUExecutionProvider"]
