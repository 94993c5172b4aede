//! Binding a run's inputs to an executable, for every backend: inputs checked by name, dtype and rank, and
//! symbolic dims bound from their shapes (static dims checked).

use std::collections::{BTreeMap, HashMap};

use kiln_ir::{Dim, Shape, Tensor, TensorType, TensorView};
use kiln_plan::exec::Executable;

use crate::RunError;

/// Named inputs as views, for [`check_inputs`].
pub fn views(inputs: &BTreeMap<String, Tensor>) -> Vec<(&str, TensorView<'_>)> {
    inputs.iter().map(|(n, t)| (n.as_str(), t.view())).collect()
}

/// The inputs in executable order, checked for name, dtype and rank (each name given once).
pub fn check_inputs<'a>(exe: &Executable, inputs: &[(&str, TensorView<'a>)]) -> Result<Vec<TensorView<'a>>, RunError> {
    let names = || exe.inputs.iter().map(|(n, _)| format!("`{n}`")).collect::<Vec<_>>().join(", ");
    if let Some((extra, _)) = inputs.iter().find(|(k, _)| !exe.inputs.iter().any(|(n, _)| n == k)) {
        return Err(RunError::Input(format!("the model has no input `{extra}` (inputs: {})", names())));
    }
    let mut out = Vec::with_capacity(exe.inputs.len());
    for (name, b) in &exe.inputs {
        let mut given = inputs.iter().filter(|(n, _)| n == name);
        let (_, t) = given.next().ok_or_else(|| RunError::Input(format!("input `{name}` is missing")))?;
        if given.next().is_some() {
            return Err(RunError::Input(format!("input `{name}` is given twice")));
        }
        let ty = &exe.buffers[b.0 as usize].ty;
        if t.dtype() != ty.dtype {
            return Err(RunError::Input(format!("input `{name}` should be {}, got {}", ty.dtype, t.dtype())));
        }
        if t.shape().len() != ty.shape.0.len() {
            return Err(RunError::Input(format!("input `{name}` should have shape {}, got {:?}", ty.shape, t.shape())));
        }
        out.push(*t);
    }
    Ok(out)
}

/// Symbolic dims bound from the inputs' shapes, static dims checked; then the value of every derived dim
/// (`kiln_ir::dim`: an expression over symbols, such as a convolution's output extent) the program's buffers
/// use, evaluated from them. A derived dim that comes out negative (inputs too small for a window) is an error.
pub fn bind_symbols(exe: &Executable, given: &[TensorView<'_>]) -> Result<HashMap<String, u64>, RunError> {
    let mut symbols: HashMap<String, u64> = HashMap::new();
    // Plain symbols first: a derived dim of an input is checked once they are all bound.
    let mut order: Vec<(&(String, kiln_plan::exec::BufferId), &TensorView<'_>)> =
        exe.inputs.iter().zip(given).collect();
    order.sort_by_key(|((_, b), _)| exe.buffers[b.0 as usize].ty.shape.0.iter().any(Dim::is_derived));
    for ((name, b), t) in order {
        let ty = &exe.buffers[b.0 as usize].ty;
        for (axis, (d, &n)) in ty.shape.0.iter().zip(t.shape()).enumerate() {
            // The extent this dim must have, when known.
            let want = match d {
                Dim::Static(s) => Some(*s),
                Dim::Sym(s) if d.is_derived() => match derived_value(s, &symbols)? {
                    Some(v) => Some(v),
                    None => Some(*symbols.entry(s.clone()).or_insert(n as u64)),
                },
                Dim::Sym(s) => Some(*symbols.entry(s.clone()).or_insert(n as u64)),
            };
            if let Some(want) = want.filter(|&w| w != n as u64) {
                return Err(RunError::Input(format!(
                    "input `{name}` should have shape {} (dim {axis} is {d}{}), got {:?}",
                    ty.shape,
                    match d {
                        Dim::Sym(_) => format!(" = {want}"),
                        Dim::Static(_) => String::new(),
                    },
                    t.shape()
                )));
            }
        }
    }
    derive_symbols(exe, &mut symbols)?;
    Ok(symbols)
}

/// Binds the data-dependent symbols of buffer `b`'s declared type to the extents `got` of the result a step
/// produced for it (`non_zero`'s count), checking every other dim against its static or bound value, then
/// derives the dims that depend on them. On a mismatch nothing is bound and the error says what was declared.
pub fn bind_result(
    exe: &Executable,
    b: kiln_plan::exec::BufferId,
    dtype: kiln_ir::DType,
    got: &[usize],
    symbols: &mut HashMap<String, u64>,
) -> Result<(), RunError> {
    let ty = &exe.buffers[b.0 as usize].ty;
    let wrong = |symbols: &HashMap<String, u64>| {
        let bound: Vec<String> = ty
            .shape
            .0
            .iter()
            .filter_map(|d| match d {
                Dim::Sym(s) => symbols.get(s).map(|v| format!("{s} = {v}")),
                Dim::Static(_) => None,
            })
            .collect();
        RunError::Op(format!(
            "a result of data-dependent extent is {dtype}{got:?}, the program declares {ty}{}",
            if bound.is_empty() { String::new() } else { format!(" with {}", bound.join(", ")) }
        ))
    };
    if dtype != ty.dtype || got.len() != ty.shape.rank() {
        return Err(wrong(symbols));
    }
    let mut bound = symbols.clone();
    for (d, &n) in ty.shape.0.iter().zip(got) {
        let n = n as u64;
        let have = match d {
            Dim::Static(s) => Some(*s),
            Dim::Sym(s) => symbol_value(s, &bound).ok().map(|v| v as u64),
        };
        match (have, d) {
            (Some(h), _) if h != n => return Err(wrong(symbols)),
            (Some(_), _) => {}
            (None, Dim::Sym(s)) if !d.is_derived() => {
                bound.insert(s.clone(), n);
            }
            (None, _) => return Err(wrong(symbols)),
        }
    }
    *symbols = bound;
    derive_symbols(exe, symbols)
}

/// The extents of buffer `b`, or `None` while a data-dependent symbol of its type is unbound (a result of
/// `non_zero`, or of an op over one, before the producing step has run).
pub fn known_dims(
    exe: &Executable,
    b: kiln_plan::exec::BufferId,
    symbols: &HashMap<String, u64>,
) -> Result<Option<Vec<usize>>, RunError> {
    let unbound = exe.buffers[b.0 as usize].ty.shape.0.iter().any(|d| match d {
        Dim::Sym(s) => symbol_value(s, symbols).is_err(),
        Dim::Static(_) => false,
    });
    if unbound { Ok(None) } else { exe.dims(b, symbols).map(Some).map_err(RunError::Backend) }
}

/// Adds to `symbols` the value of every derived dim of the program's buffers that the bound symbols determine:
/// after the inputs bind theirs, and again whenever a step binds a data-dependent one (`non_zero`'s count).
pub fn derive_symbols(exe: &Executable, symbols: &mut HashMap<String, u64>) -> Result<(), RunError> {
    for d in exe.buffers.iter().flat_map(|b| &b.ty.shape.0) {
        if let Dim::Sym(s) = d
            && d.is_derived()
            && !symbols.contains_key(s)
            && let Some(v) = derived_value(s, symbols)?
        {
            symbols.insert(s.clone(), v);
        }
    }
    Ok(())
}

/// The value of symbol `name` for a kernel launch: bound, or a derived dim evaluated from the bound symbols
/// (one a kernel reads that no buffer of the program has, such as an im2col matrix's extent). An unbound
/// symbol, or a derived dim that cannot be evaluated, is an error: no kernel runs with a guessed extent.
pub fn symbol_value(name: &str, symbols: &HashMap<String, u64>) -> Result<i64, RunError> {
    if let Some(&v) = symbols.get(name) {
        return i64::try_from(v).map_err(|_| RunError::Input(format!("symbol `{name}` = {v} is out of range")));
    }
    match derived_value(name, symbols)? {
        Some(v) => i64::try_from(v).map_err(|_| RunError::Input(format!("extent `{name}` = {v} is out of range"))),
        None => Err(RunError::Backend(format!("symbol `{name}` is not bound by the inputs"))),
    }
}

/// The value of derived dim `name` with `symbols` bound: `None` while a symbol it reads is unbound; an error
/// when it is negative.
fn derived_value(name: &str, symbols: &HashMap<String, u64>) -> Result<Option<u64>, RunError> {
    let Some(e) = kiln_ir::dim::DimExpr::parse(name) else { return Ok(None) };
    match e.eval(&|s| symbols.get(s).and_then(|&n| i64::try_from(n).ok())) {
        Ok(v) => u64::try_from(v).map(Some).map_err(|_| {
            let bound: Vec<String> =
                e.symbols().iter().filter_map(|s| symbols.get(s).map(|v| format!("{s} = {v}"))).collect();
            RunError::Input(format!(
                "with {}, the model's extent `{name}` would be {v}: the inputs are too small for it",
                bound.join(", ")
            ))
        }),
        Err(_) => Ok(None),
    }
}

/// `given` plus deterministic pseudo-random values for the `inputs` it lacks (see [`Model::random_inputs`]).
pub fn complete_inputs(
    inputs: &[(String, TensorType)],
    mut given: BTreeMap<String, Tensor>,
    shapes: &BTreeMap<String, Vec<usize>>,
    seed: u64,
) -> Result<BTreeMap<String, Tensor>, RunError> {
    for name in given.keys().chain(shapes.keys()) {
        if !inputs.iter().any(|(n, _)| n == name) {
            return Err(RunError::Input(format!("the model has no input `{name}` (inputs: {})", names(inputs))));
        }
    }
    let mut symbols = bind_declared(inputs, &given)?;
    for (i, (name, ty)) in inputs.iter().enumerate() {
        if given.contains_key(name) {
            continue;
        }
        let dims = match shapes.get(name) {
            Some(d) => {
                check_dims(name, &ty.shape, d, &mut symbols)?;
                d.clone()
            }
            None => ty
                .shape
                .0
                .iter()
                .map(|d| match d {
                    Dim::Static(n) => Ok(*n as usize),
                    Dim::Sym(s) => symbols.get(s).copied().ok_or_else(|| {
                        RunError::Input(format!(
                            "input `{name}` has symbolic dim `{s}`: give its value with --input {name}=FILE.npy or --shape {name}={}",
                            example_shape(&ty.shape)
                        ))
                    }),
                })
                .collect::<Result<_, _>>()?,
        };
        let t = Tensor::try_random(ty.dtype, dims, seed.wrapping_add(i as u64))
            .map_err(|e| RunError::Input(format!("input `{name}`: {e}")))?;
        given.insert(name.clone(), t);
    }
    Ok(given)
}

/// The input names, quoted, for messages.
pub fn names(inputs: &[(String, TensorType)]) -> String {
    inputs.iter().map(|(n, _)| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

fn example_shape(s: &Shape) -> String {
    s.0.iter().map(|d| d.as_static().unwrap_or(1).to_string()).collect::<Vec<_>>().join("x")
}

/// Checks given tensors against the declared input types (name → type, in order) and binds symbolic dims
/// consistently across them.
pub fn bind_declared(
    inputs: &[(String, TensorType)],
    given: &BTreeMap<String, Tensor>,
) -> Result<BTreeMap<String, usize>, RunError> {
    let mut symbols = BTreeMap::new();
    for (name, ty) in inputs {
        let Some(t) = given.get(name) else { continue };
        if t.dtype() != ty.dtype {
            return Err(RunError::Input(format!(
                "input `{name}` must be {}, got {} (expected {ty})",
                ty.dtype,
                t.dtype()
            )));
        }
        check_dims(name, &ty.shape, t.shape(), &mut symbols)?;
    }
    Ok(symbols)
}

fn check_dims(
    name: &str,
    declared: &Shape,
    got: &[usize],
    symbols: &mut BTreeMap<String, usize>,
) -> Result<(), RunError> {
    let shown = || format!("[{}]", got.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(","));
    if declared.rank() != got.len() {
        return Err(RunError::Input(format!("input `{name}` must have shape {declared}, got {}", shown())));
    }
    for (d, &n) in declared.0.iter().zip(got) {
        match d {
            Dim::Static(k) if *k as usize != n => {
                return Err(RunError::Input(format!("input `{name}` must have shape {declared}, got {}", shown())));
            }
            Dim::Sym(s) => {
                if let Some(&prev) = symbols.get(s)
                    && prev != n
                {
                    return Err(RunError::Input(format!(
                        "input `{name}` gives symbolic dim `{s}` = {n}, but another input bound it to {prev}"
                    )));
                }
                symbols.insert(s.clone(), n);
            }
            Dim::Static(_) => {}
        }
    }
    Ok(())
}
