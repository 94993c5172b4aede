//! The node-level backend contract: what a backend can run, and running one node with optional prefix state.
//!
//! A [`Node`] is one unit of work a backend is asked to run: a single tensor op (`matmul`, `add`, …) with its
//! attributes, or a token step — autoregressive decoding with a named stateful model, where the inputs are token
//! ids and the state is the model's key/value cache for a prefix. A backend declares what it covers as plain data
//! ([`Capabilities`]); the registry matches nodes against that data, so "can this backend run this node?" is
//! answered without calling it.
//!
//! States are opaque to everyone but their backend: a [`BackendState`] is a shared handle the runtime stores (in
//! the prefix cache) and hands back. A backend that can externalize its states implements
//! [`Backend::export_state`] and [`Backend::import_state`], which must round-trip; one that cannot returns
//! `None` from export, so a checkpoint drops the state and a resume starts from a cold cache.

use std::any::Any;
use std::sync::Arc;

use kiln_ir::{Op, Tensor};

use crate::RunError;

/// Which tensor ops a backend runs, by mnemonic.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpSupport {
    /// Every op kiln has.
    All,
    /// Exactly these mnemonics (`add`, `matmul`, …), sorted.
    Only(Vec<String>),
}

impl OpSupport {
    /// A set of mnemonics, sorted and deduplicated.
    pub fn only<I: IntoIterator<Item = S>, S: Into<String>>(mnemonics: I) -> OpSupport {
        let mut v: Vec<String> = mnemonics.into_iter().map(Into::into).collect();
        v.sort();
        v.dedup();
        OpSupport::Only(v)
    }

    /// Whether the op with this mnemonic is covered.
    pub fn covers(&self, mnemonic: &str) -> bool {
        match self {
            OpSupport::All => true,
            OpSupport::Only(v) => v.binary_search_by(|m| m.as_str().cmp(mnemonic)).is_ok(),
        }
    }
}

impl std::fmt::Display for OpSupport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpSupport::All => f.write_str("all ops"),
            OpSupport::Only(v) => f.write_str(&v.join(",")),
        }
    }
}

/// What a backend can do, as data.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Capabilities {
    /// Runs tensor op nodes (those in `ops`).
    pub tensor: bool,
    /// Runs token nodes (autoregressive decoding steps).
    pub token: bool,
    /// Resumes token nodes from a prefix state (`run_with_cache` with `Some(prefix_state)`).
    pub cache: bool,
    /// Its states survive a process: `export_state` returns bytes that `import_state` rebuilds.
    pub state_export: bool,
    /// The tensor ops it runs (meaningful when `tensor`).
    pub ops: OpSupport,
}

impl Capabilities {
    /// Nothing at all; a starting point for `..Capabilities::none()`.
    pub fn none() -> Capabilities {
        Capabilities { tensor: false, token: false, cache: false, state_export: false, ops: OpSupport::Only(vec![]) }
    }

    /// Why these capabilities do not cover `node`, or `None` when they do.
    pub fn missing_for(&self, node: &Node) -> Option<String> {
        match &node.kind {
            NodeKind::Op(op) => {
                if !self.tensor {
                    Some("no tensor support".into())
                } else if !self.ops.covers(op.mnemonic()) {
                    Some(format!("op `{}` not among {}", op.mnemonic(), self.ops))
                } else {
                    None
                }
            }
            NodeKind::Token { .. } => {
                if !self.token {
                    Some("no token support".into())
                } else if node.needs_cache && !self.cache {
                    Some("no prefix-cache support".into())
                } else {
                    None
                }
            }
        }
    }

    /// Whether these capabilities cover `node`.
    pub fn covers(&self, node: &Node) -> bool {
        self.missing_for(node).is_none()
    }
}

impl std::fmt::Display for Capabilities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if self.tensor {
            parts.push(format!("tensor({})", self.ops));
        }
        if self.token {
            parts.push("token".to_string());
        }
        if self.cache {
            parts.push("cache".to_string());
        }
        if self.state_export {
            parts.push("state-export".to_string());
        }
        if parts.is_empty() {
            parts.push("nothing".to_string());
        }
        f.write_str(&parts.join(" "))
    }
}

/// What kind of work a node is.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeKind {
    /// One tensor op with its attributes; inputs and outputs are its operands and results.
    Op(Op),
    /// Greedy autoregressive decoding with the stateful model `model`: the inputs are the prompt's token ids (one
    /// `i64` vector); the output is the generated ids.
    Token {
        /// Which model (a name the backend knows, such as a model directory's name).
        model: String,
        /// How many tokens to generate (the request's generation length; `run_with_cache`'s
        /// `remaining_tokens` is the count of prompt tokens the prefix state does not cover, as in the seed).
        max_new_tokens: u32,
    },
}

/// One unit of work for a backend.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// A name for messages (the graph node's name, a request id).
    pub name: String,
    /// What to run.
    pub kind: NodeKind,
    /// Whether the caller wants to resume from prefix state (token nodes only); selection then requires `cache`.
    pub needs_cache: bool,
}

impl Node {
    /// A tensor op node.
    pub fn op(name: impl Into<String>, op: Op) -> Node {
        Node { name: name.into(), kind: NodeKind::Op(op), needs_cache: false }
    }

    /// A token node for `model` generating `max_new_tokens` tokens, resuming from prefix state when
    /// `needs_cache`.
    pub fn token(name: impl Into<String>, model: impl Into<String>, needs_cache: bool, max_new_tokens: u32) -> Node {
        Node { name: name.into(), kind: NodeKind::Token { model: model.into(), max_new_tokens }, needs_cache }
    }

    /// The node's kind as a name: the op's mnemonic, or `token`.
    pub fn kind_name(&self) -> &str {
        match &self.kind {
            NodeKind::Op(op) => op.mnemonic(),
            NodeKind::Token { .. } => "token",
        }
    }
}

/// A backend-owned state behind a [`BackendState`] handle (a key/value cache, a plugin's opaque pointer).
pub trait StateHandle: Any + Send + Sync {
    /// Bytes the state holds, for cache budgets.
    fn bytes(&self) -> u64;
    /// How many tokens of prefix the state covers (0 for states that are not token states).
    fn tokens(&self) -> usize;
    /// The state as `Any`, for its own backend to downcast.
    fn as_any(&self) -> &dyn Any;
}

/// A shared handle to a backend-owned state. Cloning shares the state; the state is released when the last
/// handle drops.
#[derive(Clone)]
pub struct BackendState(Arc<dyn StateHandle>);

impl BackendState {
    /// Wraps a backend's state.
    pub fn new<S: StateHandle>(state: S) -> BackendState {
        BackendState(Arc::new(state))
    }

    /// The state as its concrete type, if it is one.
    pub fn downcast<S: StateHandle>(&self) -> Option<&S> {
        self.0.as_any().downcast_ref::<S>()
    }

    /// Bytes the state holds.
    pub fn bytes(&self) -> u64 {
        self.0.bytes()
    }

    /// Tokens of prefix the state covers.
    pub fn tokens(&self) -> usize {
        self.0.tokens()
    }
}

impl std::fmt::Debug for BackendState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BackendState({} tokens, {} bytes)", self.tokens(), self.bytes())
    }
}

/// What running a node cost and saved.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    /// Prompt tokens covered by the prefix state that was used (0 without one).
    pub reused_prefix_len: u32,
    /// Model invocations (a prefill is one; each decode step is one).
    pub compute_steps: u32,
    /// Tokens fed to the model, summed over its invocations.
    pub tokens_sent: u32,
    /// Tokens not fed because the prefix state already covered them.
    pub tokens_saved: u32,
    /// Whether a prefix state was used.
    pub used_cached_state: bool,
}

/// The result of [`Backend::run_with_cache`].
#[derive(Debug)]
pub struct RunResult {
    /// The node's outputs, in order.
    pub outputs: Vec<Tensor>,
    /// The state after the run (for token nodes: covering the prompt and the generated tokens), if the backend
    /// keeps one.
    pub state: Option<BackendState>,
    /// Counters of the run.
    pub counters: Counters,
}

/// A backend that runs nodes. Object safe: the registry holds `Arc<dyn Backend>`.
pub trait Backend: Send + Sync {
    /// What the backend can run.
    fn capabilities(&self) -> Capabilities;

    /// The tensor backend underneath (`cpu`, `cuda`), or empty when there is none to name.
    fn tensor_backend_type(&self) -> &str {
        ""
    }

    /// The state's bytes when this backend can externalize it; `None` when it cannot (the default).
    fn export_state(&self, _state: &BackendState) -> Option<Vec<u8>> {
        None
    }

    /// Rebuilds a live state from [`Backend::export_state`]'s bytes. Corrupt, truncated or mismatched bytes are
    /// an error (the caller then starts cold); the default says states are not portable.
    fn import_state(&self, _bytes: &[u8]) -> Result<BackendState, RunError> {
        Err(RunError::State("this backend's states are not portable".into()))
    }

    /// Runs `node` on `inputs`. For token nodes, `prefix_state` is a state to resume from (its tokens are a prefix
    /// of the prompt, or share one with it) and `remaining_tokens` the count of prompt tokens it does not cover —
    /// the tokens still to feed, in the seed contract's meaning (the caller's estimate from its cache; a backend
    /// may find a shorter shared prefix itself); how many tokens to generate is the node's
    /// ([`NodeKind::Token::max_new_tokens`]). Tensor nodes ignore both.
    fn run_with_cache(
        &self,
        node: &Node,
        inputs: &[Tensor],
        prefix_state: Option<&BackendState>,
        remaining_tokens: u32,
    ) -> Result<RunResult, RunError>;
}
