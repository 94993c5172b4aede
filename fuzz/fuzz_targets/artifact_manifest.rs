#![no_main]
//! Fuzz target `artifact_manifest`: see `fuzz/src/runtime_props.rs`.

#[path = "../src/runtime_props.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::artifact_manifest(data));
