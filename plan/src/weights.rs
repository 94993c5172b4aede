//! What a compiled program remembers about weights: fingerprints of values it does not keep, and which of its
//! weights are the model's parameters and which the compiler made ([`WeightProvenance`]). Both travel in an
//! artifact's manifest, so a runtime can hold a weight swap to the model it was compiled from.

use std::collections::{BTreeMap, BTreeSet};

use kiln_ir::{DType, Graph, Op, Tensor};

/// A weight value remembered without its bytes: dtype, shape and the BLAKE3 digest of the little-endian bytes
/// (stable across processes and machines, so artifacts can carry it; a match means equal bytes).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WeightFingerprint {
    /// The element type.
    pub dtype: DType,
    /// The extents.
    pub shape: Vec<usize>,
    /// BLAKE3 of the bytes, as lower-case hex.
    pub blake3: String,
}

impl WeightFingerprint {
    /// The fingerprint of a dtype, shape and bytes.
    pub fn of(dtype: DType, shape: &[usize], bytes: &[u8]) -> WeightFingerprint {
        WeightFingerprint { dtype, shape: shape.to_vec(), blake3: blake3::hash(bytes).to_hex().to_string() }
    }

    /// The fingerprint of a tensor.
    pub fn of_tensor(t: &Tensor) -> WeightFingerprint {
        WeightFingerprint::of(t.dtype(), t.shape(), t.as_bytes())
    }
}

/// Where a compiled program's weights come from: the pass pipeline may make weights (`fold-constants`,
/// `fold-batchnorm`) and may stop reading a model parameter as such (folded into another weight, or dead).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WeightProvenance {
    /// Weights of the compiled program that the pass pipeline made (not model parameters).
    pub compiler_made: BTreeSet<String>,
    /// Model parameters the compiled program does not read as such, with their compile-time values.
    pub folded: BTreeMap<String, WeightFingerprint>,
}

impl WeightProvenance {
    /// Compares the model graph (before passes) with the weight names the compiled program reads.
    pub fn new(model: &Graph, program_weights: &BTreeSet<String>) -> WeightProvenance {
        let params: BTreeSet<String> = model
            .params()
            .filter_map(|id| match &model.node(id).op {
                Op::Parameter(p) => Some(p.name.clone()),
                _ => None,
            })
            .collect();
        let compiler_made = program_weights.difference(&params).cloned().collect();
        let folded = params
            .difference(program_weights)
            .filter_map(|name| {
                let t = model.weights.get(name)?;
                Some((name.clone(), WeightFingerprint::of(t.dtype(), t.shape(), t.as_bytes())))
            })
            .collect();
        WeightProvenance { compiler_made, folded }
    }
}

/// The BLAKE3 digest of `bytes` as lower-case hex (what manifests record for their files).
pub fn digest(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}
