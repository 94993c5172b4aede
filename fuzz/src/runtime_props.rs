//! The properties of the fuzz targets over what the runtime reads from users without the compiler: `.npy` inputs,
//! artifact manifests and exported generation states. Kept apart from `libfuzzer-sys` (and from `lib.rs`, whose
//! properties need the compiler) so `runtime/tests/fuzz_smoke.rs` runs the same bodies on deterministic mutations.
//! Each function panics exactly when its property is broken.

use std::path::Path;

use kiln_ir::{DType, Tensor};
use kiln_runtime::state::{DecoderSpec, KvState, format};

/// Reading arbitrary bytes as `.npy` gives a tensor or an `NpyError`, never a panic, an abort or a huge
/// allocation; a tensor that reads writes back to bytes that read as the same tensor.
pub fn npy_read(data: &[u8]) {
    let Ok(t) = kiln_runtime::npy::parse(Path::new("fuzz.npy"), data) else { return };
    assert_eq!(t.len(), t.shape().iter().product::<usize>(), "element count of {:?}", t.shape());
    let again = kiln_runtime::npy::parse(Path::new("again.npy"), &kiln_runtime::npy::to_bytes(&t))
        .unwrap_or_else(|e| panic!("a tensor that was read does not read back: {e}"));
    assert_eq!((again.dtype(), again.shape(), again.as_bytes()), (t.dtype(), t.shape(), t.as_bytes()));
}

/// Parsing arbitrary bytes as an artifact manifest gives a manifest whose program is consistent, or an
/// `ArtifactError`, never a panic; an accepted manifest serializes to text that parses again.
pub fn artifact_manifest(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(m) = kiln_plan::artifact::parse_manifest(Path::new("manifest.json"), text) else { return };
    let again = serde_json::to_string(&m).expect("a manifest serializes");
    kiln_plan::artifact::parse_manifest(Path::new("again.json"), &again)
        .unwrap_or_else(|e| panic!("an accepted manifest does not parse back: {e}"));
}

/// The decoder shape states are checked against: 2 layers, 2 heads of 3, vocabulary 50, f32.
pub fn state_spec() -> DecoderSpec {
    DecoderSpec {
        input_ids: "input_ids".into(),
        position_ids: "position_ids".into(),
        attention_mask: "attention_mask".into(),
        past: vec![["pk".into(), "pv".into()]; 2],
        present: vec![["k".into(), "v".into()]; 2],
        logits: "logits".into(),
        heads: 2,
        head_dim: 3,
        vocab: 50,
        dtype: DType::F32,
        max_positions: None,
    }
}

/// The fingerprint states are checked against.
pub const STATE_FINGERPRINT: u64 = 42;

/// A valid state of [`state_spec`] with `tokens` tokens (a seed for mutations).
pub fn state_seed(tokens: usize) -> Vec<u8> {
    let t = |seed| Tensor::random(DType::F32, vec![1, 2, tokens, 3], seed);
    let ids = (0..tokens as u32).map(|i| i % 50).collect();
    let state = KvState::new(STATE_FINGERPRINT, ids, vec![[t(1), t(2)], [t(3), t(4)]]).expect("a consistent state");
    format::encode(&state)
}

/// Decoding arbitrary bytes as an exported state gives a state of the spec or a clear error, never a panic or an
/// allocation beyond what the bytes hold; an accepted state encodes back to exactly the same bytes.
pub fn state_decode(data: &[u8]) {
    let Ok(state) = format::decode(data, &state_spec(), STATE_FINGERPRINT) else { return };
    assert_eq!(format::encode(&state), data, "an accepted state is not in its canonical encoding");
}
