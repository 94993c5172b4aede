//! Fuzz target: arbitrary bytes through the ONNX importer must never panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kiln_fuzz::onnx_import(data));
