//! Control flow: `if` runs the branch its condition picks, `loop` runs its body while the trip count and the
//! condition allow. The interpreter runs the bodies through [`FusionBody::eval`], so a region means what its graph
//! means; a backend that compiles the bodies drives them through the same [`run_if`] and [`run_loop`] (the
//! condition, trip count, iteration cap, carried-value and scan-output checks and the stacking are defined once,
//! here), handing in its own body runner.

use std::collections::HashMap;

use crate::dim::{DimExpr, is_identifier};
use crate::fusion::FusionBody;
use crate::op::{If, Loop};
use crate::tensor::Tensor;
use crate::types::{DType, Dim, TensorType};

/// The iterations a loop may run before the interpreter stops it with an error: `KILN_MAX_LOOP_ITERATIONS`, or
/// 2^24. A loop whose condition never turns false would otherwise run forever.
pub fn max_loop_iterations() -> u64 {
    std::env::var("KILN_MAX_LOOP_ITERATIONS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(1 << 24)
}

/// The one bool element of `t`, named `what` in errors.
fn flag(t: &Tensor, what: &str) -> Result<bool, String> {
    if t.dtype() != DType::Bool || t.len() != 1 {
        return Err(format!("{what} must be one bool, got {}", t.tensor_type()));
    }
    Ok(t.to_i64_vec()[0] != 0)
}

/// Runs one region body on its arguments: what [`run_if`] and [`run_loop`] call.
pub type BodyRunner<'a> = dyn FnMut(usize, &[&Tensor]) -> Result<Vec<Tensor>, String> + 'a;

/// `if cond, captures…` on the interpreter.
pub(crate) fn if_(op: &If, inputs: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    run_if(inputs, &mut |branch, args| if branch == 0 { &op.then_branch } else { &op.else_branch }.eval(args))
}

/// `if cond, captures…` with the branches run by `run` (called with 0 for `then_branch`, 1 for `else_branch`,
/// and the captures).
pub fn run_if(inputs: &[&Tensor], run: &mut BodyRunner<'_>) -> Result<Vec<Tensor>, String> {
    let cond = inputs.first().ok_or("`if` needs a condition")?;
    let (name, branch) = if flag(cond, "the condition")? { ("then_branch", 0) } else { ("else_branch", 1) };
    run(branch, &inputs[1..]).map_err(|e| format!("{name}: {e}"))
}

/// `loop max_trip, cond, carried…, captures…` on the interpreter.
pub(crate) fn loop_(op: &Loop, inputs: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    run_loop(op, inputs, &mut |_, args| op.body.eval(args))
}

/// `loop max_trip, cond, carried…, captures…` with the body run by `run` (called with 0 and the iteration's
/// arguments: the iteration number, the condition, the carried values and the captures). `op`'s body gives the
/// output count and the scan outputs' types (which size them when the loop runs no iteration).
pub fn run_loop(op: &Loop, inputs: &[&Tensor], run: &mut BodyRunner<'_>) -> Result<Vec<Tensor>, String> {
    let n = usize::try_from(op.carried)
        .ok()
        .filter(|&n| inputs.len() >= 2 && n <= inputs.len() - 2)
        .ok_or_else(|| format!("carried={} does not fit {} operand(s)", op.carried, inputs.len()))?;
    if inputs[0].dtype() != DType::I64 || inputs[0].len() != 1 {
        return Err(format!("max_trip must be one i64, got {}", inputs[0].tensor_type()));
    }
    let max_trip = inputs[0].to_i64_vec()[0];
    let mut cond = flag(inputs[1], "cond")?;
    let scan_outputs = op.body.0.outputs().len().checked_sub(1 + n).ok_or("the body gives too few outputs")?;
    let captures = &inputs[2 + n..];
    let limit = max_loop_iterations();
    let mut carried: Vec<Tensor> = inputs[2..2 + n].iter().map(|t| (*t).clone()).collect();
    let mut scans: Vec<Vec<Tensor>> = vec![Vec::new(); scan_outputs];
    let mut i: i64 = 0;
    while i < max_trip && cond {
        if i as u64 >= limit {
            return Err(format!(
                "the loop ran {limit} iterations without stopping (set KILN_MAX_LOOP_ITERATIONS to allow more)"
            ));
        }
        let (iteration, flag_in) = (Tensor::scalar(i), Tensor::scalar(cond));
        let mut args: Vec<&Tensor> = vec![&iteration, &flag_in];
        args.extend(carried.iter());
        args.extend(captures.iter().copied());
        let mut outs = run(0, &args).map_err(|e| format!("iteration {i}: {e}"))?;
        if outs.len() != 1 + n + scan_outputs {
            return Err(format!("iteration {i}: the body gave {} output(s)", outs.len()));
        }
        let scanned = outs.split_off(1 + n);
        cond = flag(&outs[0], "the body's condition")?;
        for (k, (new, old)) in outs[1..].iter().zip(&carried).enumerate() {
            if new.dtype() != old.dtype() || new.shape().len() != old.shape().len() {
                return Err(format!(
                    "iteration {i}: carried value {k} became {} from {}",
                    new.tensor_type(),
                    old.tensor_type()
                ));
            }
        }
        carried = outs.split_off(1);
        for (j, (all, t)) in scans.iter_mut().zip(scanned).enumerate() {
            // Checked as the values arrive: a body whose scan output changes shape, or whose stack outgrows what
            // can be allocated, stops the loop at once.
            if let Some(first) = all.first()
                && (t.dtype() != first.dtype() || t.shape() != first.shape())
            {
                return Err(format!(
                    "scan output {j}: iteration {i} gives {}, iteration 0 gave {} (scan outputs keep one shape)",
                    t.tensor_type(),
                    first.tensor_type()
                ));
            }
            let mut stacked = vec![all.len() + 1];
            stacked.extend_from_slice(t.shape());
            Tensor::allocatable_bytes(t.dtype(), &stacked).map_err(|e| format!("scan output {j}: {e}"))?;
            all.push(t);
        }
        i += 1;
    }
    let body_outputs: Vec<&TensorType> =
        op.body.0.outputs().iter().filter_map(|(_, v)| op.body.0.value_type(*v)).collect();
    let mut results = carried;
    for (j, per_iteration) in scans.into_iter().enumerate() {
        results.push(match per_iteration.first() {
            Some(first) => stack(&per_iteration, first).map_err(|e| format!("scan output {j}: {e}"))?,
            None => {
                let t = body_outputs.get(1 + n + j).ok_or("the body gives too few outputs")?;
                let mut shape = vec![0];
                shape.extend(empty_extents(&op.body, inputs, t).map_err(|e| format!("scan output {j}: {e}"))?);
                Tensor::zeros(t.dtype, shape)
            }
        });
    }
    Ok(results)
}

/// The per-iteration values of a scan output (of one shape, checked as they arrived) along a new leading axis.
fn stack(values: &[Tensor], first: &Tensor) -> Result<Tensor, String> {
    let mut bytes = Vec::with_capacity(first.as_bytes().len() * values.len());
    for t in values {
        bytes.extend_from_slice(t.as_bytes());
    }
    let mut shape = vec![values.len()];
    shape.extend_from_slice(first.shape());
    Tensor::from_bytes(first.dtype(), shape, &bytes).ok_or_else(|| "the stacked values do not fit".to_string())
}

/// The extents of body output type `t` when the body never ran: its static dims, and its symbolic ones from the
/// symbols the operands bind on the body's inputs.
fn empty_extents(body: &FusionBody, inputs: &[&Tensor], t: &TensorType) -> Result<Vec<usize>, String> {
    let g = &body.0;
    let mut bound: HashMap<String, i64> = HashMap::new();
    for (&id, x) in g.inputs().iter().zip(inputs) {
        let Some(declared) = g.node(id).outputs.first() else { continue };
        for (d, &extent) in declared.shape.0.iter().zip(x.shape()) {
            if let Dim::Sym(s) = d
                && is_identifier(s)
            {
                bound.insert(s.clone(), extent as i64);
            }
        }
    }
    t.shape
        .0
        .iter()
        .map(|d| {
            let e = DimExpr::of(d).ok_or_else(|| format!("cannot size {t} without an iteration"))?;
            let v =
                e.eval(&|s| bound.get(s).copied()).map_err(|m| format!("cannot size {t} without an iteration: {m}"))?;
            usize::try_from(v).map_err(|_| format!("{t} has a negative extent"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    fn body(text: &str) -> FusionBody {
        FusionBody(Box::new(parse(text).unwrap()))
    }

    #[test]
    fn if_runs_the_branch_the_condition_picks() {
        let then_branch = body(
            "graph \"t\" {\n  %0 = input {name=\"p0\"} : f32[2]\n  %1 = neg %0 : f32[2]\n  output \"y\" = %1\n}\n",
        );
        let else_branch = body("graph \"e\" {\n  %0 = input {name=\"p0\"} : f32[2]\n  output \"y\" = %0\n}\n");
        let op = If { then_branch, else_branch, count: "c".into() };
        let x = Tensor::from_vec(vec![2], vec![1.0f32, -2.0]).unwrap();
        let y = if_(&op, &[&Tensor::scalar(true), &x]).unwrap();
        assert_eq!(y[0].as_slice::<f32>().unwrap(), &[-1.0, 2.0]);
        let y = if_(&op, &[&Tensor::scalar(false), &x]).unwrap();
        assert_eq!(y[0].as_slice::<f32>().unwrap(), &[1.0, -2.0]);
        assert!(if_(&op, &[&x, &x]).unwrap_err().contains("must be one bool"));
    }

    /// A loop that doubles a value, stops when it passes 20, and scans the iteration numbers.
    fn doubling() -> Loop {
        let body = body(
            "graph \"b\" {\n  %0 = input {name=\"p0\"} : i64[]\n  %1 = input {name=\"p1\"} : bool[]\n  \
             %2 = input {name=\"p2\"} : f32[]\n  %3 = add %2, %2 : f32[]\n  %4 = constant {value=f32[] [20.0]} : \
             f32[]\n  %5 = lt %3, %4 : bool[]\n  output \"c\" = %5\n  output \"x\" = %3\n  output \"i\" = %0\n}\n",
        );
        Loop { body, carried: 1, count: "n".into() }
    }

    #[test]
    fn loops_stop_on_the_trip_count_or_the_condition() {
        let op = doubling();
        let run = |max: i64, x: f32| {
            let out = loop_(&op, &[&Tensor::scalar(max), &Tensor::scalar(true), &Tensor::scalar(x)]).unwrap();
            (out[0].as_slice::<f32>().unwrap()[0], out[1].to_i64_vec(), out[1].shape().to_vec())
        };
        assert_eq!(run(10, 3.0), (24.0, vec![0, 1, 2], vec![3]));
        assert_eq!(run(2, 3.0), (12.0, vec![0, 1], vec![2]));
        // Zero iterations: the initial value, and an empty scan.
        assert_eq!(run(0, 3.0), (3.0, vec![], vec![0]));
        assert_eq!(run(-5, 3.0), (3.0, vec![], vec![0]));
        let bad = loop_(&op, &[&Tensor::scalar(1i64), &Tensor::scalar(1i64), &Tensor::scalar(1.0f32)]);
        assert!(bad.unwrap_err().contains("cond must be one bool"));
    }

    #[test]
    fn a_scan_output_that_changes_shape_is_an_error() {
        // The scan output is the carried vector, which grows by one element per iteration.
        let body = body(
            "graph \"b\" {\n  %0 = input {name=\"p0\"} : i64[]\n  %1 = input {name=\"p1\"} : bool[]\n  \
             %2 = input {name=\"p2\"} : f32[n]\n  %3 = constant {value=f32[1] [1.0]} : f32[1]\n  \
             %4 = concat %2, %3 {axis=0} : f32[n+1]\n  output \"c\" = %1\n  output \"x\" = %4\n  \
             output \"s\" = %4\n}\n",
        );
        let op = Loop { body, carried: 1, count: "k".into() };
        let x = Tensor::from_vec(vec![1], vec![0.0f32]).unwrap();
        let one = loop_(&op, &[&Tensor::scalar(1i64), &Tensor::scalar(true), &x]).unwrap();
        assert_eq!((one[0].shape(), one[1].shape()), (&[2][..], &[1, 2][..]));
        let err = loop_(&op, &[&Tensor::scalar(5i64), &Tensor::scalar(true), &x]).unwrap_err();
        assert!(err.contains("scan output 0: iteration 1 gives f32[3], iteration 0 gave f32[2]"), "{err}");
    }

    #[test]
    fn a_loop_past_the_iteration_limit_is_an_error() {
        // The condition stays true for x = 0 (0 + 0 < 20): only the limit stops it.
        let op = doubling();
        // SAFETY (of the test): no other test in this crate reads the variable.
        unsafe { std::env::set_var("KILN_MAX_LOOP_ITERATIONS", "100") };
        let r = loop_(&op, &[&Tensor::scalar(i64::MAX), &Tensor::scalar(true), &Tensor::scalar(0.0f32)]);
        unsafe { std::env::remove_var("KILN_MAX_LOOP_ITERATIONS") };
        assert!(r.unwrap_err().contains("ran 100 iterations"));
    }
}
