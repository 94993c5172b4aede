#![no_main]
//! Fuzz target `artifact_manifest`: see `fuzz/src/runtime_props.rs`.

#[path = "../src/runtime_props.rs"]
#[allow(dead_code)] // each target uses one property
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::artifact_manifest(data));
