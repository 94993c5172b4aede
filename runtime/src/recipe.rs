//! Derived-weight recipes: a weight computed from checkpoint tensors (a fused QKV matrix concatenated from three,
//! a transposed or rescaled one, a slice of a larger one) described as neutral data, so any backend can
//! materialize it and the description can travel in JSON.
//!
//! A recipe is a tree: leaves name checkpoint tensors ([`DerivedWeightRecipe::Tensor`]), inner nodes transform
//! their sources. [`DerivedWeightRecipe::validate`] checks the whole tree against a [`CheckpointSource`]'s
//! declared dtypes and shapes — reading no tensor bytes — and gives the result's type, or an error naming the
//! step and the tensor. [`DerivedWeightRecipe::evaluate`] validates, then computes the result on the host:
//! transposes, slices and concatenations move bytes exactly (NaN payloads and `-0.0` survive); `scale` and
//! float `cast`s compute in f64 and round once to the result dtype.
//!
//! JSON form (externally tagged by `op`):
//! ```json
//! {"op": "concat", "axis": 1, "sources": [
//!   {"op": "tensor", "name": "q.weight"},
//!   {"op": "scale", "factor": 0.125, "source": {"op": "tensor", "name": "k.weight"}},
//!   {"op": "cast", "dtype": "f32", "source": {"op": "tensor", "name": "v.weight"}}]}
//! ```

use kiln_ir::tensor::Data;
use kiln_ir::{DType, Tensor};

use crate::RunError;
use crate::checkpoint::{CheckpointSource, TensorInfo};

/// How to derive one weight from checkpoint tensors. See the module docs.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum DerivedWeightRecipe {
    /// A checkpoint tensor as it is.
    Tensor {
        /// Its name in the checkpoint.
        name: String,
    },
    /// Axes permuted: result axis `i` is source axis `perm[i]`.
    Transpose {
        /// What is transposed.
        source: Box<DerivedWeightRecipe>,
        /// A permutation of `0..rank`.
        perm: Vec<usize>,
    },
    /// Elements converted to `dtype`: any dtype to a float dtype; integers and bools to integer dtypes (a value
    /// that does not fit is an error). Floats to integers are refused (no rounding rule to pick silently).
    Cast {
        /// What is converted.
        source: Box<DerivedWeightRecipe>,
        /// The result dtype.
        dtype: DType,
    },
    /// Indices `start, start + step, …` below `end` along `axis`.
    Slice {
        /// What is sliced.
        source: Box<DerivedWeightRecipe>,
        /// The axis.
        axis: usize,
        /// First index.
        start: usize,
        /// One past the last index (at most the axis' extent).
        end: usize,
        /// Stride, at least 1.
        #[serde(default = "one")]
        step: usize,
    },
    /// Sources joined along `axis`; their dtypes and other extents agree.
    Concat {
        /// At least one source.
        sources: Vec<DerivedWeightRecipe>,
        /// The axis.
        axis: usize,
    },
    /// Every element multiplied by `factor` (float dtypes only).
    Scale {
        /// What is scaled.
        source: Box<DerivedWeightRecipe>,
        /// The factor.
        factor: f64,
    },
}

fn one() -> usize {
    1
}

impl DerivedWeightRecipe {
    /// A leaf naming a checkpoint tensor.
    pub fn tensor(name: impl Into<String>) -> DerivedWeightRecipe {
        DerivedWeightRecipe::Tensor { name: name.into() }
    }

    /// The step's name, for messages.
    pub fn op_name(&self) -> &'static str {
        match self {
            DerivedWeightRecipe::Tensor { .. } => "tensor",
            DerivedWeightRecipe::Transpose { .. } => "transpose",
            DerivedWeightRecipe::Cast { .. } => "cast",
            DerivedWeightRecipe::Slice { .. } => "slice",
            DerivedWeightRecipe::Concat { .. } => "concat",
            DerivedWeightRecipe::Scale { .. } => "scale",
        }
    }

    /// Every checkpoint tensor the recipe reads, in order of first use.
    pub fn leaves(&self) -> Vec<&str> {
        let mut out = Vec::new();
        self.collect_leaves(&mut out);
        out
    }

    fn collect_leaves<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            DerivedWeightRecipe::Tensor { name } => {
                if !out.contains(&name.as_str()) {
                    out.push(name)
                }
            }
            DerivedWeightRecipe::Transpose { source, .. }
            | DerivedWeightRecipe::Cast { source, .. }
            | DerivedWeightRecipe::Slice { source, .. }
            | DerivedWeightRecipe::Scale { source, .. } => source.collect_leaves(out),
            DerivedWeightRecipe::Concat { sources, .. } => sources.iter().for_each(|s| s.collect_leaves(out)),
        }
    }

    /// A short description for messages: the op and the tensors it reads.
    fn describe(&self) -> String {
        format!(
            "{} of {}",
            self.op_name(),
            self.leaves().iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
        )
    }

    /// The result's dtype and shape, checking every step against `source`'s declared tensors (no bytes read).
    pub fn validate(&self, source: &dyn CheckpointSource) -> Result<TensorInfo, RunError> {
        let fail = |message: String| RunError::Checkpoint {
            path: source.origin().to_string(),
            message: format!("recipe {}: {message}", self.describe()),
        };
        match self {
            DerivedWeightRecipe::Tensor { name } => source.info(name),
            DerivedWeightRecipe::Transpose { source: s, perm } => {
                let info = s.validate(source)?;
                let mut seen = vec![false; info.shape.len()];
                let ok = perm.len() == info.shape.len()
                    && perm.iter().all(|&p| p < seen.len() && !std::mem::replace(&mut seen[p], true));
                if !ok {
                    return Err(fail(format!(
                        "perm {perm:?} is not a permutation of the {} axes of {:?}",
                        info.shape.len(),
                        info.shape
                    )));
                }
                Ok(TensorInfo { dtype: info.dtype, shape: perm.iter().map(|&p| info.shape[p]).collect() })
            }
            DerivedWeightRecipe::Cast { source: s, dtype } => {
                let info = s.validate(source)?;
                if info.dtype.is_float() && !dtype.is_float() {
                    return Err(fail(format!(
                        "cast from {} to {dtype} is not supported (floats cast only to floats)",
                        info.dtype
                    )));
                }
                Ok(TensorInfo { dtype: *dtype, shape: info.shape })
            }
            DerivedWeightRecipe::Slice { source: s, axis, start, end, step } => {
                let info = s.validate(source)?;
                let Some(&extent) = info.shape.get(*axis) else {
                    return Err(fail(format!("axis {axis} is out of range for shape {:?}", info.shape)));
                };
                if *step == 0 || start > end || *end > extent {
                    return Err(fail(format!(
                        "{start}..{end} step {step} is not a valid range of axis {axis} (extent {extent})"
                    )));
                }
                let mut shape = info.shape;
                shape[*axis] = (end - start).div_ceil(*step);
                Ok(TensorInfo { dtype: info.dtype, shape })
            }
            DerivedWeightRecipe::Concat { sources, axis } => {
                let infos = sources.iter().map(|s| s.validate(source)).collect::<Result<Vec<_>, _>>()?;
                let Some(first) = infos.first() else {
                    return Err(fail("no sources".into()));
                };
                if *axis >= first.shape.len() {
                    return Err(fail(format!("axis {axis} is out of range for shape {:?}", first.shape)));
                }
                let mut shape = first.shape.clone();
                shape[*axis] = 0;
                for (i, info) in infos.iter().enumerate() {
                    let fits = info.shape.len() == first.shape.len()
                        && info.shape.iter().zip(&first.shape).enumerate().all(|(a, (x, y))| a == *axis || x == y);
                    if info.dtype != first.dtype || !fits {
                        return Err(fail(format!(
                            "source {i} is {} {:?} but source 0 is {} {:?} (only axis {axis} may differ)",
                            info.dtype, info.shape, first.dtype, first.shape
                        )));
                    }
                    shape[*axis] += info.shape[*axis];
                }
                Ok(TensorInfo { dtype: first.dtype, shape })
            }
            DerivedWeightRecipe::Scale { source: s, factor } => {
                let info = s.validate(source)?;
                if !info.dtype.is_float() {
                    return Err(fail(format!("scale needs a float tensor, not {}", info.dtype)));
                }
                if !factor.is_finite() {
                    return Err(fail(format!("factor {factor} is not finite")));
                }
                Ok(info)
            }
        }
    }

    /// Validates, then computes the weight on the host. See the module docs for exactness.
    pub fn evaluate(&self, source: &dyn CheckpointSource) -> Result<Tensor, RunError> {
        self.validate(source)?;
        self.eval(source)
    }

    fn eval(&self, source: &dyn CheckpointSource) -> Result<Tensor, RunError> {
        let fail = |message: String| RunError::Checkpoint {
            path: source.origin().to_string(),
            message: format!("recipe {}: {message}", self.describe()),
        };
        let rebuild = |dtype: DType, shape: Vec<usize>, bytes: &[u8]| {
            Tensor::from_bytes(dtype, shape, bytes).ok_or_else(|| fail("internal size mismatch".into()))
        };
        match self {
            DerivedWeightRecipe::Tensor { name } => source.lease(name)?.to_tensor(),
            DerivedWeightRecipe::Transpose { source: s, perm } => {
                let t = s.eval(source)?;
                let shape: Vec<usize> = perm.iter().map(|&p| t.shape()[p]).collect();
                rebuild(t.dtype(), shape, &permute_bytes(t.as_bytes(), t.shape(), perm, t.dtype().size_bytes()))
            }
            DerivedWeightRecipe::Slice { source: s, axis, start, end, step } => {
                let t = s.eval(source)?;
                let (outer, inner) = split(t.shape(), *axis, t.dtype().size_bytes());
                let extent = t.shape()[*axis];
                let bytes = t.as_bytes();
                let mut out = Vec::new();
                for o in 0..outer {
                    for i in (*start..*end).step_by(*step) {
                        let at = (o * extent + i) * inner;
                        out.extend_from_slice(&bytes[at..at + inner]);
                    }
                }
                let mut shape = t.shape().to_vec();
                shape[*axis] = (end - start).div_ceil(*step);
                rebuild(t.dtype(), shape, &out)
            }
            DerivedWeightRecipe::Concat { sources, axis } => {
                let parts = sources.iter().map(|s| s.eval(source)).collect::<Result<Vec<_>, _>>()?;
                let dtype = parts[0].dtype();
                let (outer, _) = split(parts[0].shape(), *axis, dtype.size_bytes());
                let mut out = Vec::with_capacity(parts.iter().map(|p| p.as_bytes().len()).sum());
                for o in 0..outer {
                    for p in &parts {
                        let chunk = p.as_bytes().len() / outer.max(1);
                        out.extend_from_slice(&p.as_bytes()[o * chunk..(o + 1) * chunk]);
                    }
                }
                let mut shape = parts[0].shape().to_vec();
                shape[*axis] = parts.iter().map(|p| p.shape()[*axis]).sum();
                rebuild(dtype, shape, &out)
            }
            DerivedWeightRecipe::Cast { source: s, dtype } => {
                let t = s.eval(source)?;
                cast(&t, *dtype).map_err(fail)
            }
            DerivedWeightRecipe::Scale { source: s, factor } => {
                let t = s.eval(source)?;
                let data = Data::from_f64_iter(t.dtype(), (0..t.len()).map(|i| t.data().get_f64(i) * factor));
                Tensor::new(t.shape().to_vec(), data).map_err(|e| fail(e.to_string()))
            }
        }
    }
}

/// Elements before `axis` (outer count) and bytes of one index of `axis` (the inner row).
fn split(shape: &[usize], axis: usize, elem: usize) -> (usize, usize) {
    (shape[..axis].iter().product(), shape[axis + 1..].iter().product::<usize>() * elem)
}

/// Row-major bytes of `shape` with axes permuted by `perm` (result axis `i` = source axis `perm[i]`).
pub(crate) fn permute_bytes(bytes: &[u8], shape: &[usize], perm: &[usize], elem: usize) -> Vec<u8> {
    let rank = shape.len();
    let strides = kiln_ir::tensor::strides_of(shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = vec![0usize; rank];
    for _ in 0..n {
        let src: usize = (0..rank).map(|i| index[i] * strides[perm[i]]).sum();
        out.extend_from_slice(&bytes[src * elem..(src + 1) * elem]);
        for a in (0..rank).rev() {
            index[a] += 1;
            if index[a] < out_shape[a] {
                break;
            }
            index[a] = 0;
        }
    }
    out
}

/// `t` converted to `dtype` (see [`DerivedWeightRecipe::Cast`]): exact for widening float casts, one rounding
/// for narrowing ones, checked for integers.
pub(crate) fn cast(t: &Tensor, dtype: DType) -> Result<Tensor, String> {
    if t.dtype() == dtype {
        return Ok(t.clone());
    }
    let data = if dtype.is_float() {
        Data::from_f64_iter(dtype, (0..t.len()).map(|i| t.data().get_f64(i)))
    } else if t.dtype().is_float() {
        return Err(format!("cast from {} to {dtype} is not supported (floats cast only to floats)", t.dtype()));
    } else {
        let (lo, hi) = int_range(dtype);
        let values: Vec<i64> = (0..t.len()).map(|i| t.data().get_i64(i)).collect();
        if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !(lo..=hi).contains(*v)) {
            return Err(format!("element {i} ({v}) does not fit {dtype}"));
        }
        Data::from_i64_iter(dtype, values.into_iter())
    };
    Tensor::new(t.shape().to_vec(), data).map_err(|e| e.to_string())
}

fn int_range(d: DType) -> (i64, i64) {
    match d {
        DType::Bool => (0, 1),
        // u64's values above i64's are out of reach of an i64 source anyway.
        _ => d.int_range().map_or((i64::MIN, i64::MAX), |(lo, hi)| (lo as i64, hi.min(i128::from(i64::MAX)) as i64)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::MemoryCheckpoint;

    fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_vec(shape.to_vec(), v.to_vec()).unwrap()
    }

    fn source() -> MemoryCheckpoint {
        MemoryCheckpoint::new("mem")
            .with("a", &f32s(&[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]))
            .with("b", &f32s(&[1, 3], &[-0.0, f32::from_bits(0x7fc0_1234), 8.0]))
            .with("h", &Tensor::from_vec(vec![2], vec![half::f16::from_f32(1.5), half::f16::from_f32(-2.0)]).unwrap())
            .with("i", &Tensor::from_vec(vec![3], vec![1i64, 300, -4]).unwrap())
    }

    fn t(name: &str) -> Box<DerivedWeightRecipe> {
        Box::new(DerivedWeightRecipe::tensor(name))
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.as_slice::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn each_kind_computes_its_result() {
        let src = source();
        let eval = |r: DerivedWeightRecipe| r.evaluate(&src).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(eval(DerivedWeightRecipe::tensor("a")), f32s(&[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]));
        assert_eq!(
            eval(DerivedWeightRecipe::Transpose { source: t("a"), perm: vec![1, 0] }),
            f32s(&[3, 2], &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0])
        );
        assert_eq!(
            eval(DerivedWeightRecipe::Slice { source: t("a"), axis: 1, start: 0, end: 3, step: 2 }),
            f32s(&[2, 2], &[0.0, 2.0, 3.0, 5.0])
        );
        let cat = eval(DerivedWeightRecipe::Concat {
            sources: vec![DerivedWeightRecipe::tensor("a"), DerivedWeightRecipe::tensor("b")],
            axis: 0,
        });
        assert_eq!(cat.shape(), &[3, 3]);
        // Bytes move exactly: -0.0 and the NaN payload survive.
        assert_eq!(bits(&cat)[6..], [0x8000_0000, 0x7fc0_1234, 8.0f32.to_bits()]);
        let cat1 = eval(DerivedWeightRecipe::Concat {
            sources: vec![DerivedWeightRecipe::tensor("a"), DerivedWeightRecipe::tensor("a")],
            axis: 1,
        });
        assert_eq!(cat1, f32s(&[2, 6], &[0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 3.0, 4.0, 5.0]));
        assert_eq!(eval(DerivedWeightRecipe::Cast { source: t("h"), dtype: DType::F32 }), f32s(&[2], &[1.5, -2.0]));
        assert_eq!(
            eval(DerivedWeightRecipe::Cast { source: t("i"), dtype: DType::I32 }),
            Tensor::from_vec(vec![3], vec![1i32, 300, -4]).unwrap()
        );
        assert_eq!(
            eval(DerivedWeightRecipe::Scale { source: t("a"), factor: 0.5 }),
            f32s(&[2, 3], &[0.0, 0.5, 1.0, 1.5, 2.0, 2.5])
        );
        // Nested: the transpose of a scaled slice.
        let nested = DerivedWeightRecipe::Transpose {
            source: Box::new(DerivedWeightRecipe::Scale {
                source: Box::new(DerivedWeightRecipe::Slice { source: t("a"), axis: 0, start: 1, end: 2, step: 1 }),
                factor: 2.0,
            }),
            perm: vec![1, 0],
        };
        assert_eq!(eval(nested), f32s(&[3, 1], &[6.0, 8.0, 10.0]));
    }

    #[test]
    fn bad_recipes_are_errors_naming_step_and_tensor() {
        let src = source();
        let cases = [
            (DerivedWeightRecipe::tensor("nope"), "has no tensor `nope`"),
            (DerivedWeightRecipe::Transpose { source: t("a"), perm: vec![0, 0] }, "transpose of `a`: perm [0, 0]"),
            (DerivedWeightRecipe::Transpose { source: t("a"), perm: vec![0] }, "is not a permutation of the 2 axes"),
            (DerivedWeightRecipe::Cast { source: t("a"), dtype: DType::I32 }, "cast from f32 to i32 is not supported"),
            (
                DerivedWeightRecipe::Slice { source: t("a"), axis: 2, start: 0, end: 1, step: 1 },
                "axis 2 is out of range",
            ),
            (
                DerivedWeightRecipe::Slice { source: t("a"), axis: 1, start: 0, end: 4, step: 1 },
                "0..4 step 1 is not a valid range",
            ),
            (DerivedWeightRecipe::Slice { source: t("a"), axis: 1, start: 0, end: 2, step: 0 }, "step 0"),
            (DerivedWeightRecipe::Concat { sources: vec![], axis: 0 }, "no sources"),
            (
                DerivedWeightRecipe::Concat {
                    sources: vec![DerivedWeightRecipe::tensor("a"), DerivedWeightRecipe::tensor("b")],
                    axis: 1,
                },
                "source 1 is f32 [1, 3] but source 0 is f32 [2, 3]",
            ),
            (
                DerivedWeightRecipe::Concat {
                    sources: vec![DerivedWeightRecipe::tensor("a"), DerivedWeightRecipe::tensor("h")],
                    axis: 0,
                },
                "source 1 is f16",
            ),
            (DerivedWeightRecipe::Scale { source: t("i"), factor: 2.0 }, "scale needs a float tensor, not i64"),
            (DerivedWeightRecipe::Scale { source: t("a"), factor: f64::NAN }, "is not finite"),
        ];
        for (recipe, want) in cases {
            let err = recipe.evaluate(&src).unwrap_err().to_string();
            assert!(err.starts_with("checkpoint mem: "), "{err}");
            assert!(err.contains(want), "`{err}` lacks `{want}`");
        }
        let overflow = DerivedWeightRecipe::Cast { source: t("i"), dtype: DType::I8 };
        let err = overflow.evaluate(&src).unwrap_err().to_string();
        assert!(err.contains("element 1 (300) does not fit i8"), "{err}");
    }

    #[test]
    fn json_form_round_trips() {
        let text = r#"{"op": "concat", "axis": 1, "sources": [
            {"op": "tensor", "name": "q"},
            {"op": "scale", "factor": 0.125, "source": {"op": "tensor", "name": "k"}},
            {"op": "slice", "axis": 0, "start": 1, "end": 5, "source": {"op": "tensor", "name": "v"}},
            {"op": "cast", "dtype": "f32", "source": {"op": "transpose", "perm": [1, 0], "source": {"op": "tensor", "name": "w"}}}]}"#;
        let r: DerivedWeightRecipe = serde_json::from_str(text).unwrap();
        assert_eq!(r.leaves(), ["q", "k", "v", "w"]);
        let DerivedWeightRecipe::Concat { sources, .. } = &r else { panic!("{r:?}") };
        assert!(matches!(sources[2], DerivedWeightRecipe::Slice { step: 1, .. }), "step defaults to 1");
        let back: DerivedWeightRecipe = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        let err = serde_json::from_str::<DerivedWeightRecipe>(r#"{"op": "rotate", "source": {}}"#).unwrap_err();
        assert!(err.to_string().contains("unknown variant `rotate`"), "{err}");
    }
}
