//! The `.kir` parser. (Skeleton: implemented by the printer/parser work.)

use crate::graph::Graph;

/// A `.kir` syntax or semantic error at a position, with the offending line and a caret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{col}: {message}\n{snippet}")]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column (in characters).
    pub col: usize,
    /// What is wrong.
    pub message: String,
    /// The source line and a caret under the column.
    pub snippet: String,
}

/// Parses `.kir` text into a graph.
pub fn parse(src: &str) -> Result<Graph, ParseError> {
    let _ = src;
    Err(ParseError { line: 1, col: 1, message: "not yet".into(), snippet: String::new() })
}
