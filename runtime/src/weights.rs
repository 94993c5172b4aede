//! Weight files: safetensors ↔ the graph's [`Weights`] store.
//!
//! A `.kir` model keeps its weights beside it (`model.kir` + `model.safetensors`), or takes them from
//! `--weights FILE`. safetensors is the checkpoint format of the field (no code execution on load, a JSON header
//! and raw little-endian bytes) and holds every kiln dtype.

use std::path::Path;

use kiln_ir::{DType, Tensor, Weights};
use safetensors::Dtype as St;

/// A weight file that could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("weights {path}: {message}")]
pub struct WeightsError {
    /// The weight file.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// The safetensors dtype of a kiln dtype, `None` for those safetensors lacks (float8 without `fn`/`fnuz`
/// variants there, float4 and the sub-byte integers, which it would store packed).
fn to_st(d: DType) -> Option<St> {
    Some(match d {
        DType::F32 => St::F32,
        DType::F16 => St::F16,
        DType::BF16 => St::BF16,
        DType::F64 => St::F64,
        DType::I8 => St::I8,
        DType::U8 => St::U8,
        DType::I32 => St::I32,
        DType::I64 => St::I64,
        DType::Bool => St::BOOL,
        DType::I16 => St::I16,
        DType::U16 => St::U16,
        DType::U32 => St::U32,
        DType::U64 => St::U64,
        DType::F8E4M3FN => St::F8_E4M3,
        DType::F8E5M2 => St::F8_E5M2,
        DType::F8E8M0 => St::F8_E8M0,
        DType::F8E4M3FNUZ | DType::F8E5M2FNUZ | DType::F4E2M1 | DType::I4 | DType::U4 | DType::I2 | DType::U2 => {
            return None;
        }
    })
}

/// The kiln dtype of a safetensors dtype, `None` for those kiln lacks (F8, …).
pub fn kiln_dtype(d: St) -> Option<DType> {
    Some(match d {
        St::F32 => DType::F32,
        St::F16 => DType::F16,
        St::BF16 => DType::BF16,
        St::F64 => DType::F64,
        St::I8 => DType::I8,
        St::U8 => DType::U8,
        St::I32 => DType::I32,
        St::I64 => DType::I64,
        St::BOOL => DType::Bool,
        St::I16 => DType::I16,
        St::U16 => DType::U16,
        St::U32 => DType::U32,
        St::U64 => DType::U64,
        St::F8_E4M3 => DType::F8E4M3FN,
        St::F8_E5M2 => DType::F8E5M2,
        St::F8_E8M0 => DType::F8E8M0,
        _ => return None,
    })
}

/// Reads every tensor of a safetensors file.
pub fn load(path: &Path) -> Result<Weights, WeightsError> {
    let bytes = kiln_ir::io::read_file(path)
        .map_err(|e| WeightsError { path: path.display().to_string(), message: e.to_string() })?;
    parse(path, &bytes)
}

/// Reads every tensor of safetensors `bytes` (read from `path`, which names it in errors).
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Weights, WeightsError> {
    let bad = |message: String| WeightsError { path: path.display().to_string(), message };
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
    let mut w = Weights::default();
    for (name, view) in st.iter() {
        let dtype = kiln_dtype(view.dtype())
            .ok_or_else(|| bad(format!("tensor `{name}` has unsupported dtype {:?}", view.dtype())))?;
        // One copy per tensor (safetensors is little-endian, as every host kiln runs on).
        let t = Tensor::from_bytes(dtype, view.shape().to_vec(), view.data()).ok_or_else(|| {
            bad(format!("tensor `{name}`: {} bytes do not fit {:?}", view.data().len(), view.shape()))
        })?;
        w.insert(name, t);
    }
    Ok(w)
}

/// Writes every weight to a safetensors file.
pub fn save(path: &Path, weights: &Weights) -> Result<(), WeightsError> {
    let bad = |message: String| WeightsError { path: path.display().to_string(), message };
    let owned: Vec<(String, DType, Vec<usize>, Vec<u8>)> =
        weights.iter().map(|(n, t)| (n.to_string(), t.dtype(), t.shape().to_vec(), t.data().to_le_bytes())).collect();
    let views = owned
        .iter()
        .map(|(n, d, s, b)| {
            let st = to_st(*d).ok_or_else(|| bad(format!("weight `{n}`: safetensors has no {d} type")))?;
            safetensors::tensor::TensorView::new(st, s.clone(), b)
                .map(|v| (n.as_str(), v))
                .map_err(|e| bad(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize_to_file(views, None, path).map_err(|e| bad(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_dtype() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        let mut w = Weights::default();
        for (i, dt) in DType::ALL.into_iter().enumerate().filter(|(_, d)| to_st(*d).is_some()) {
            w.insert(format!("t{i}"), Tensor::random(dt, vec![2, 3], i as u64));
        }
        save(&path, &w).unwrap();
        assert_eq!(load(&path).unwrap(), w);
        // The types safetensors lacks are an error naming the weight and the type.
        let mut w = Weights::default();
        w.insert("q", Tensor::random(DType::I4, vec![2], 0));
        let err = save(&path, &w).unwrap_err().to_string();
        assert!(err.contains("weight `q`: safetensors has no i4 type"), "{err}");
    }

    #[test]
    fn truncated_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        let mut w = Weights::default();
        w.insert("a", Tensor::random(DType::F32, vec![16], 0));
        save(&path, &w).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
        assert!(matches!(load(&path), Err(WeightsError { .. })));
    }
}
