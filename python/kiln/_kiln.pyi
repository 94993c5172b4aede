"""Type stubs of kiln's extension module (re-exported by the ``kiln`` package)."""

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

__version__: str

class KilnError(Exception):
    """Every error kiln raises derives from this class."""

class InvalidModel(KilnError):
    """The model, weights or artifact could not be read or is malformed."""

class Unsupported(KilnError):
    """The model uses an op, attribute, dtype or backend kiln does not support (or fallbacks were denied)."""

class InvalidInput(KilnError):
    """The feeds do not fit the model: a name, dtype, shape or value."""

class ExecutionError(KilnError):
    """Running the model failed."""

class FallbackWarning(UserWarning):
    """Nodes of the model run on kiln's reference interpreter (correct, slow)."""

class NodeArg:
    """A model input or output as ONNX Runtime describes it."""

    @property
    def name(self) -> str: ...
    @property
    def shape(self) -> List[Union[int, str]]:
        """Extents: an int for a static dim, the dim's name for a symbolic one."""
    @property
    def type(self) -> str:
        """The tensor type as ONNX Runtime spells it: ``tensor(float)``, ``tensor(int64)``..."""

class Generation:
    """The outcome of :meth:`InferenceSession.generate`."""

    @property
    def ids(self) -> List[int]: ...
    @property
    def logits(self) -> np.ndarray: ...
    @property
    def state(self) -> bytes: ...
    @property
    def reused_prefix_len(self) -> int: ...
    @property
    def tokens_sent(self) -> int: ...
    @property
    def tokens_saved(self) -> int: ...
    @property
    def compute_steps(self) -> int: ...
    @property
    def used_cached_state(self) -> bool: ...
    @property
    def cache_entries(self) -> int: ...
    @property
    def cache_bytes(self) -> int: ...
    @property
    def cache_evicted(self) -> int: ...

class InferenceSession:
    """A loaded, compiled model; one session serves many threads at once."""

    def __init__(
        self,
        path_or_bytes: Union[str, os.PathLike, bytes],
        sess_options: Any = None,
        providers: Optional[Sequence[Union[str, Tuple[str, Dict[str, Any]]]]] = None,
        provider_options: Any = None,
        *,
        threads: Optional[int] = None,
        backend: Optional[str] = None,
        shapes: Optional[Mapping[str, Sequence[int]]] = None,
        fallback: str = "warn",
    ) -> None: ...
    def get_inputs(self) -> List[NodeArg]: ...
    def get_outputs(self) -> List[NodeArg]: ...
    def get_providers(self) -> List[str]: ...
    @property
    def backend(self) -> str: ...
    @property
    def fallbacks(self) -> List[Tuple[str, str, str]]: ...
    def run(
        self,
        output_names: Optional[Sequence[str]],
        input_feed: Mapping[str, Any],
        run_options: Any = None,
    ) -> List[np.ndarray]: ...
    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, state: Optional[bytes] = None) -> Generation: ...

def load(artifact_dir: Union[str, os.PathLike], *, threads: Optional[int] = None, fallback: str = "warn") -> InferenceSession: ...
def compile(
    model: Union[str, os.PathLike],
    out_dir: Union[str, os.PathLike],
    *,
    target: str = "cpu",
    shapes: Optional[Mapping[str, Sequence[int]]] = None,
    arch: str = "sm_80",
    fallback: str = "warn",
) -> str: ...
def check(model: Union[str, os.PathLike], *, shapes: Optional[Mapping[str, Sequence[int]]] = None) -> List[Tuple[str, str, str]]: ...
def supported_ops() -> List[str]: ...
