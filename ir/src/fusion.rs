//! Fusion bodies: the nested graph of a `fusion` node.
//!
//! A [`FusionBody`] is a [`Graph`] whose `input` nodes are named `p0`, `p1`, … in input order and bind the fusion
//! node's operands by position, with exactly the operand types; its outputs, in order, are the node's results. A
//! body holds no `param` nodes (weights reach it as operands), so it carries no weights of its own. This module
//! owns the body's attribute text form (a nested region, indented one level deeper than the node line it sits
//! on), its type rule ([`FusionBody::infer`]), its structural checks ([`FusionBody::problems`]) and its meaning
//! ([`FusionBody::eval`]: run the body on the operands). Two bodies are equal when they print the same text, which
//! is what CSE needs; the serde form is that text too, so it round-trips exactly.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::attr::{AttrSource, AttrValue};
use crate::graph::Graph;
use crate::op::Op;
use crate::tensor::Tensor;
use crate::types::TensorType;

/// The body graph of a `fusion` node. See the module docs. Boxed so that a body does not make every `Op` the
/// size of a `Graph`.
#[derive(Clone, Debug, Default)]
pub struct FusionBody(pub Box<Graph>);

/// How deeply region bodies (fusion bodies, `if` branches, loop bodies) may nest: the parser and the ONNX importer
/// refuse deeper nesting rather than recurse without bound.
pub const MAX_NESTING: usize = 16;

impl FusionBody {
    /// The name the `i`th body input must have.
    pub fn param_name(i: usize) -> String {
        format!("p{i}")
    }

    /// Structural problems that make the body unusable as a fusion body, each as a message: input names and
    /// count, `param` nodes. Empty for a good body.
    pub fn problems(&self, operands: usize) -> Vec<String> {
        let g = &self.0;
        let mut out = Vec::new();
        if g.inputs().len() != operands {
            out.push(format!("the body has {} input(s) for {operands} operand(s)", g.inputs().len()));
        }
        for (i, &id) in g.inputs().iter().enumerate() {
            match g.get(id).map(|n| &n.op) {
                Some(Op::Input(inp)) if inp.name == Self::param_name(i) => {}
                Some(Op::Input(inp)) => {
                    out.push(format!("body input {i} is named \"{}\", not \"p{i}\"", inp.name.escape_debug()))
                }
                _ => out.push(format!("body input {i} is not an `input` node")),
            }
        }
        if let Some(id) = g.params().next() {
            out.push(format!("the body holds {} (weights must be operands)", g.describe(id)));
        }
        if g.outputs().is_empty() {
            out.push("the body has no outputs".into());
        }
        out
    }

    /// Result types of the fusion node for operands of types `ins`: the body's output types, after checking that
    /// the body fits the operands (see [`FusionBody::problems`]) and that each body input has its operand's type.
    pub fn infer(&self, ins: &[TensorType]) -> Result<Vec<TensorType>, String> {
        if let Some(p) = self.problems(ins.len()).into_iter().next() {
            return Err(p);
        }
        let g = &self.0;
        for (i, (&id, t)) in g.inputs().iter().zip(ins).enumerate() {
            let declared = &g.node(id).outputs;
            if declared.len() != 1 || declared[0] != *t {
                let d = declared.first().map_or("nothing".to_string(), ToString::to_string);
                return Err(format!("operand {i} is {t}, but body input p{i} is {d}"));
            }
        }
        g.outputs()
            .iter()
            .map(|(name, v)| {
                g.value_type(*v)
                    .cloned()
                    .ok_or_else(|| format!("body output \"{}\" names no value", name.escape_debug()))
            })
            .collect()
    }

    /// The fusion node's results: the body run by the interpreter on `inputs` bound to `p0`, `p1`, ….
    pub fn eval(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        if let Some(p) = self.problems(inputs.len()).into_iter().next() {
            return Err(p);
        }
        let bound: BTreeMap<String, Tensor> =
            inputs.iter().enumerate().map(|(i, t)| (Self::param_name(i), (*t).clone())).collect();
        let results = crate::interp::run(&self.0, &bound).map_err(|e| format!("in the body: {e}"))?;
        Ok(results.into_iter().map(|(_, t)| t).collect())
    }

    /// The canonical text of the body, as a top-level graph.
    pub fn text(&self) -> String {
        crate::print::print(&self.0)
    }
}

impl PartialEq for FusionBody {
    /// Equal when the canonical texts are equal (value numbering and node ids do not matter).
    fn eq(&self, other: &FusionBody) -> bool {
        self.text() == other.text()
    }
}

impl AttrValue for FusionBody {
    /// `graph "name" { … }`, its statements indented two spaces past the line the attribute starts on.
    fn print(&self, out: &mut String) {
        let line = out.rfind('\n').map_or(0, |i| i + 1);
        let indent = out[line..].chars().take_while(|&c| c == ' ').count();
        crate::print::print_nested(&self.0, indent, out);
    }
    fn parse(src: &mut dyn AttrSource) -> Result<Self, String> {
        src.graph().map(|g| FusionBody(Box::new(g)))
    }
}

impl Serialize for FusionBody {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text())
    }
}

impl<'de> Deserialize<'de> for FusionBody {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<FusionBody, D::Error> {
        let text = String::deserialize(d)?;
        crate::parse::parse(&text).map(|g| FusionBody(Box::new(g))).map_err(serde::de::Error::custom)
    }
}
