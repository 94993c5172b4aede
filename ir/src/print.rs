//! The `.kir` printer. (Skeleton: implemented by the printer/parser work.)

use crate::graph::Graph;

/// Prints `g` as `.kir` text.
pub fn print(g: &Graph) -> String {
    let _ = g;
    String::new()
}
