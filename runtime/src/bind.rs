//! Binding a run's inputs to an executable, for every backend: inputs checked by name, dtype and rank, and
//! symbolic dims bound from their shapes (static dims checked).

use std::collections::{BTreeMap, HashMap};

use kiln_ir::{Dim, Tensor};
use kiln_plan::exec::Executable;

use crate::RunError;

/// The inputs in executable order, checked for name, dtype and rank.
pub fn check_inputs<'a>(exe: &Executable, inputs: &'a BTreeMap<String, Tensor>) -> Result<Vec<&'a Tensor>, RunError> {
    let names = || exe.inputs.iter().map(|(n, _)| format!("`{n}`")).collect::<Vec<_>>().join(", ");
    if let Some(extra) = inputs.keys().find(|k| !exe.inputs.iter().any(|(n, _)| n == *k)) {
        return Err(RunError::Input(format!("the model has no input `{extra}` (inputs: {})", names())));
    }
    let mut out = Vec::with_capacity(exe.inputs.len());
    for (name, b) in &exe.inputs {
        let t = inputs.get(name).ok_or_else(|| RunError::Input(format!("input `{name}` is missing")))?;
        let ty = &exe.buffers[b.0 as usize].ty;
        if t.dtype() != ty.dtype {
            return Err(RunError::Input(format!("input `{name}` should be {}, got {}", ty.dtype, t.dtype())));
        }
        if t.shape().len() != ty.shape.0.len() {
            return Err(RunError::Input(format!("input `{name}` should have shape {}, got {:?}", ty.shape, t.shape())));
        }
        out.push(t);
    }
    Ok(out)
}

/// Symbolic dims bound from the inputs' shapes; static dims checked.
pub fn bind_symbols(exe: &Executable, given: &[&Tensor]) -> Result<HashMap<String, u64>, RunError> {
    let mut symbols: HashMap<String, u64> = HashMap::new();
    for ((name, b), t) in exe.inputs.iter().zip(given) {
        let ty = &exe.buffers[b.0 as usize].ty;
        for (axis, (d, &n)) in ty.shape.0.iter().zip(t.shape()).enumerate() {
            let ok = match d {
                Dim::Static(s) => *s == n as u64,
                Dim::Sym(s) => *symbols.entry(s.clone()).or_insert(n as u64) == n as u64,
            };
            if !ok {
                return Err(RunError::Input(format!(
                    "input `{name}` should have shape {} (dim {axis} is {d}{}), got {:?}",
                    ty.shape,
                    match d {
                        Dim::Sym(s) => format!(" = {}", symbols[s]),
                        Dim::Static(_) => String::new(),
                    },
                    t.shape()
                )));
            }
        }
    }
    Ok(symbols)
}
