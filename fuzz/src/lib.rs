//! The properties kiln's fuzz targets check, one function per target, kept apart from `libfuzzer-sys` so the same
//! bodies also run as a plain `#[test]` over deterministic mutations (`onnx/tests/fuzz_smoke.rs` includes this
//! file) where no nightly toolchain is at hand. Each function panics exactly when its property is broken.

use std::path::Path;

/// Importing arbitrary bytes as an ONNX model returns `Ok` or an `ImportError`, never a panic. A decoded model's
/// external data resolves against a folder that does not exist, so no file outside the corpus is ever read.
pub fn onnx_import(data: &[u8]) {
    let options = kiln_onnx::ImportOptions::default();
    let _ = kiln_onnx::import_bytes(data, None, &options);
    let _ = kiln_onnx::import_bytes(data, Some(Path::new("/nonexistent/kiln-fuzz")), &options);
}

/// Parsing arbitrary text as `.kir` returns a graph or a `ParseError`, never a panic; and a graph that parses
/// prints to text that parses back to a graph printing the same text (printing is a fixed point).
pub fn kir_parse(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(graph) = kiln_ir::parse(text) else { return };
    let printed = kiln_ir::print(&graph);
    let reparsed = kiln_ir::parse(&printed)
        .unwrap_or_else(|e| panic!("printed text does not parse back: {e}\n--- printed ---\n{printed}"));
    let reprinted = kiln_ir::print(&reparsed);
    assert_eq!(printed, reprinted, "printing is not a fixed point\n--- input ---\n{text}");
}
