//! The verifier. (Skeleton: implemented by the verifier work.)

use crate::graph::Graph;

/// One problem found by the verifier, naming the node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{node}: {message}")]
pub struct VerifyError {
    /// The node, as [`Graph::describe`] names it (or `graph` for graph-level problems).
    pub node: String,
    /// What is wrong.
    pub message: String,
}

/// Checks `g`, returning every problem found.
pub fn verify(g: &Graph) -> Result<(), Vec<VerifyError>> {
    let _ = g;
    Ok(())
}
