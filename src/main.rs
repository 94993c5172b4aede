//! The `kiln` command-line tool.
fn main() {}
