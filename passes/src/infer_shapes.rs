//! `infer-shapes`: re-infers every node's result types, specializing symbolic dims that have bindings.
//!
//! Bindings come from the pass options (`infer-shapes{bind=batch:8,bind=seq:128}`, `bind` may repeat) and from
//! [`PassContext::bindings`]; an option wins over the context for the same symbol. With bindings, each bound
//! symbol is replaced by its value in the declared types of `input` and `param` nodes and in the dim-valued
//! attributes of ops (`Op::dim_attrs`: the shapes of `reshape`, `broadcast`, `iota` and `resize`, the `k` of
//! `top_k`), as the interpreter substitutes them when it runs.
//! Then every other node's result types are recomputed with `kiln_ir::infer::infer` in topological order, so
//! static extents propagate through the graph. Without bindings the pass only re-derives types, which for a
//! verified graph changes nothing. A node whose types no longer infer (a binding contradicts a static dim) is an
//! error naming the node and the bindings.

use std::collections::BTreeMap;

use kiln_ir::infer::infer;
use kiln_ir::{Graph, Op, Shape, TensorType};

use crate::declare_pass;
use crate::pass::{FromOptions, OptionDoc, OptionError, Pass, PassContext, PassError, PassOptions};

declare_pass! {
    /// Re-infers every node's result types in topological order, specializing bound symbolic dims.
    #[derive(Clone, Debug, Default)]
    pub struct InferShapes = "infer-shapes" {
        /// Symbol values given as options; they win over the context's.
        pub bindings: BTreeMap<String, u64>,
    }
}

impl FromOptions for InferShapes {
    const OPTIONS: &'static [OptionDoc] = &[OptionDoc {
        name: "bind",
        value: "SYMBOL:N",
        summary: "specialize symbolic dim SYMBOL to N (repeatable; wins over the caller's bindings)",
    }];

    fn from_options(options: &mut PassOptions<'_>) -> Result<InferShapes, OptionError> {
        let mut bindings = BTreeMap::new();
        for o in options.take_all("bind") {
            let bad = |why: &str| OptionError {
                option: o.key.clone(),
                column: o.column,
                message: format!("option `bind` of `infer-shapes`: bad value `{}`: {why}", o.value),
            };
            let (sym, n) = o.value.split_once(':').ok_or_else(|| bad("expected SYMBOL:N"))?;
            if !kiln_ir::verify::is_valid_symbol(sym) {
                return Err(bad("the symbol is not an identifier"));
            }
            let n: u64 = n.parse().map_err(|e| bad(&format!("{e}")))?;
            if bindings.insert(sym.to_string(), n).is_some_and(|old| old != n) {
                return Err(bad("the symbol is bound twice"));
            }
        }
        Ok(InferShapes { bindings })
    }
}

impl Pass for InferShapes {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn summary(&self) -> &'static str {
        Self::SUMMARY
    }

    fn run(&self, g: &mut Graph, cx: &PassContext) -> Result<bool, PassError> {
        let mut bindings = cx.bindings.clone();
        bindings.extend(self.bindings.iter().map(|(k, v)| (k.clone(), *v)));
        specialize(g, &bindings)
    }
}

/// Specializes `g` (and, recursively, the regions of its nodes, whose inputs must keep the operand types)
/// under `bindings`; says whether anything changed.
fn specialize(g: &mut Graph, bindings: &BTreeMap<String, u64>) -> Result<bool, PassError> {
    {
        let order =
            g.topo_order().map_err(|c| PassError::at(InferShapes::NAME, g.describe(c.0), "the graph has a cycle"))?;
        let mut changed = false;
        for id in order {
            let node = g.node(id);
            let sub = |s: &Shape| s.substitute(bindings);
            // Only dim-valued attributes are rewritten, and compared by dim: `Op`'s `==` never holds for a
            // constant holding NaN, which would report a change on every run.
            let new_op = match &node.op {
                // Regions (fusion bodies, `if` branches, loop bodies) bind their inputs to the operands' types.
                op if !op.bodies().is_empty() => {
                    let mut new = op.clone();
                    let mut changed = false;
                    for body in new.bodies_mut() {
                        changed |= specialize(&mut body.0, bindings)?;
                    }
                    changed.then_some(new)
                }
                op => op.substitute_dims(bindings),
            };
            let outputs = match &node.op {
                Op::Input(_) | Op::Parameter(_) => {
                    node.outputs.iter().map(|t| TensorType::new(t.dtype, sub(&t.shape))).collect()
                }
                op => {
                    let types =
                        node.inputs.iter().map(|&v| g.value_type(v).cloned()).collect::<Option<Vec<_>>>().ok_or_else(
                            || PassError::at(InferShapes::NAME, g.describe(id), "an operand has no type"),
                        )?;
                    infer(new_op.as_ref().unwrap_or(op), &types).map_err(|m| {
                        let b: Vec<String> = bindings.iter().map(|(k, v)| format!("{k}={v}")).collect();
                        PassError::at(InferShapes::NAME, g.describe(id), format!("{m} (bindings: {})", b.join(", ")))
                    })?
                }
            };
            if new_op.is_some() || outputs != node.outputs {
                let n = g.node_mut(id);
                if let Some(op) = new_op {
                    *n.op = op;
                }
                *n.outputs = outputs;
                changed = true;
            }
        }
        Ok(changed)
    }
}
