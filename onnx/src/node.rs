//! One ONNX node as a handler sees it: resolved inputs and checked attribute access.
//!
//! Every attribute read is recorded. After a handler succeeds, any attribute it did not read is reported as
//! unsupported — an attribute the importer does not understand must never be silently ignored.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::Path;

use kiln_ir::Tensor;
use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::{AttributeProto, GraphProto, NodeProto};

use crate::import::Val;
use crate::tensor::tensor_from_proto;

/// A node with its inputs resolved (`None` for omitted optional inputs).
pub(crate) struct OnnxNode<'a> {
    pub proto: &'a NodeProto,
    pub inputs: Vec<Option<Val>>,
    pub opset: i64,
    pub base_dir: Option<&'a Path>,
    used: RefCell<BTreeSet<String>>,
    /// Positions of the inputs the handler looked at.
    read_inputs: RefCell<BTreeSet<usize>>,
    /// Attributes read as one type but declared (or holding data) of another, with why.
    mistyped: RefCell<Vec<String>>,
}

/// The kind an attribute holds: its declared type, or — for files that leave it `UNDEFINED` — the one field that
/// holds data (`None` when no field does: a zero or empty value of any kind).
fn held_kind(a: &AttributeProto) -> Option<AttributeType> {
    match a.type_.enum_value() {
        Ok(AttributeType::UNDEFINED) => {}
        Ok(t) => return Some(t),
        Err(_) => return Some(AttributeType::UNDEFINED),
    }
    let held: Vec<AttributeType> = [
        (a.f != 0.0, AttributeType::FLOAT),
        (a.i != 0, AttributeType::INT),
        (!a.s.is_empty(), AttributeType::STRING),
        (a.t.is_some(), AttributeType::TENSOR),
        (a.g.is_some(), AttributeType::GRAPH),
        (!a.floats.is_empty(), AttributeType::FLOATS),
        (!a.ints.is_empty(), AttributeType::INTS),
        (!a.strings.is_empty(), AttributeType::STRINGS),
        (!a.tensors.is_empty(), AttributeType::TENSORS),
        (!a.graphs.is_empty(), AttributeType::GRAPHS),
    ]
    .into_iter()
    .filter_map(|(set, t)| set.then_some(t))
    .collect();
    match held[..] {
        [] => None,
        [t] => Some(t),
        // Several kinds of data and no declared type: nothing says which one is meant.
        _ => Some(AttributeType::UNDEFINED),
    }
}

impl<'a> OnnxNode<'a> {
    pub fn new(proto: &'a NodeProto, inputs: Vec<Option<Val>>, opset: i64, base_dir: Option<&'a Path>) -> Self {
        OnnxNode {
            proto,
            inputs,
            opset,
            base_dir,
            used: RefCell::new(BTreeSet::new()),
            read_inputs: RefCell::new(BTreeSet::new()),
            mistyped: RefCell::new(Vec::new()),
        }
    }

    /// The name of output `i` (empty when the node leaves it unnamed or has fewer).
    pub fn output_name(&self, i: usize) -> &str {
        self.proto.output.get(i).map_or("", String::as_str)
    }

    /// Required input `i`.
    pub fn input(&self, i: usize) -> Result<&Val, String> {
        self.read_inputs.borrow_mut().insert(i);
        self.inputs.get(i).and_then(Option::as_ref).ok_or_else(|| format!("input {i} is required"))
    }

    /// Optional input `i`.
    pub fn opt_input(&self, i: usize) -> Option<&Val> {
        self.read_inputs.borrow_mut().insert(i);
        self.inputs.get(i).and_then(Option::as_ref)
    }

    /// Given inputs the handler never looked at (by position and name): an extra input, or an optional one the
    /// handler does not support — never silently ignored.
    pub fn unread_inputs(&self) -> Vec<(usize, String)> {
        let read = self.read_inputs.borrow();
        self.proto
            .input
            .iter()
            .enumerate()
            .filter(|(i, name)| !name.is_empty() && !read.contains(i))
            .map(|(i, name)| (i, name.clone()))
            .collect()
    }

    /// All given inputs, requiring each to be present.
    pub fn all_inputs(&self) -> Result<Vec<&Val>, String> {
        (0..self.inputs.len()).map(|i| self.input(i)).collect()
    }

    fn attr(&self, name: &str) -> Option<&'a AttributeProto> {
        let a = self.proto.attribute.iter().find(|a| a.name == name)?;
        self.used.borrow_mut().insert(name.to_string());
        Some(a)
    }

    /// Attribute `name` when it holds `want`'s kind; one of another kind is recorded (the node is then refused,
    /// see [`OnnxNode::mistyped_attributes`]) and reads as absent — never as a zero of the wrong field.
    fn typed(&self, name: &str, want: AttributeType) -> Option<&'a AttributeProto> {
        let a = self.attr(name)?;
        match held_kind(a) {
            None => Some(a),
            Some(t) if t == want => Some(a),
            Some(AttributeType::UNDEFINED) => {
                self.mistyped.borrow_mut().push(format!(
                    "attribute `{name}` has no (or an unknown) declared type and holds data of several kinds; `{}` \
                     takes it as {want:?}",
                    self.proto.op_type
                ));
                None
            }
            Some(t) => {
                self.mistyped
                    .borrow_mut()
                    .push(format!("attribute `{name}` is {t:?}, but `{}` takes it as {want:?}", self.proto.op_type));
                None
            }
        }
    }

    /// Attributes that were read as another type than they hold (each a message).
    pub fn mistyped_attributes(&self) -> Vec<String> {
        self.mistyped.borrow().clone()
    }

    /// Marks attributes as understood without reading them (they do not affect inference results).
    pub fn ignore(&self, names: &[&str]) {
        for n in names {
            self.attr(n);
        }
    }

    /// An integer attribute.
    pub fn int(&self, name: &str, default: i64) -> i64 {
        self.typed(name, AttributeType::INT).map_or(default, |a| a.i)
    }

    /// An integer attribute without a default.
    pub fn opt_int(&self, name: &str) -> Option<i64> {
        self.typed(name, AttributeType::INT).map(|a| a.i)
    }

    /// A float attribute.
    pub fn float(&self, name: &str, default: f32) -> f32 {
        self.typed(name, AttributeType::FLOAT).map_or(default, |a| a.f)
    }

    /// A float attribute without a default.
    pub fn opt_float(&self, name: &str) -> Option<f32> {
        self.typed(name, AttributeType::FLOAT).map(|a| a.f)
    }

    /// An integer-list attribute.
    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.typed(name, AttributeType::INTS).map(|a| a.ints.clone())
    }

    /// A float-list attribute.
    pub fn floats(&self, name: &str) -> Option<Vec<f32>> {
        self.typed(name, AttributeType::FLOATS).map(|a| a.floats.clone())
    }

    /// A string attribute.
    pub fn string(&self, name: &str) -> Option<String> {
        self.typed(name, AttributeType::STRING).map(|a| String::from_utf8_lossy(&a.s).into_owned())
    }

    /// A string-list attribute.
    pub fn strings(&self, name: &str) -> Option<Vec<String>> {
        self.typed(name, AttributeType::STRINGS)
            .map(|a| a.strings.iter().map(|s| String::from_utf8_lossy(s).into_owned()).collect())
    }

    /// A tensor attribute.
    pub fn tensor(&self, name: &str) -> Result<Option<Tensor>, String> {
        match self.typed(name, AttributeType::TENSOR) {
            Some(a) => a.t.as_ref().map(|t| tensor_from_proto(t, self.base_dir)).transpose(),
            None => Ok(None),
        }
    }

    /// A graph attribute.
    pub fn graph(&self, name: &str) -> Option<&'a GraphProto> {
        self.typed(name, AttributeType::GRAPH).and_then(|a| a.g.as_ref())
    }

    /// Attributes present on the node that no one read.
    pub fn unread_attributes(&self) -> Vec<String> {
        let used = self.used.borrow();
        self.proto.attribute.iter().filter(|a| !used.contains(&a.name)).map(|a| a.name.clone()).collect()
    }
}
