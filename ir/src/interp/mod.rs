//! The reference interpreter. (Skeleton: implemented by the interpreter work.)

use std::collections::BTreeMap;

use crate::graph::Graph;
use crate::tensor::Tensor;

/// An op could not be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{node}: {message}")]
pub struct InterpError {
    /// The node, as [`Graph::describe`] names it.
    pub node: String,
    /// What went wrong.
    pub message: String,
}

/// Runs `g` on named inputs; returns the named outputs in order.
pub fn run(g: &Graph, inputs: &BTreeMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, InterpError> {
    let _ = (g, inputs);
    Ok(vec![])
}
