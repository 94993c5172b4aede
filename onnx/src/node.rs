//! One ONNX node as a handler sees it: resolved inputs and checked attribute access.
//!
//! Every attribute read is recorded. After a handler succeeds, any attribute it did not read is reported as
//! unsupported — an attribute the importer does not understand must never be silently ignored.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::Path;

use kiln_ir::Tensor;
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
}

impl<'a> OnnxNode<'a> {
    pub fn new(proto: &'a NodeProto, inputs: Vec<Option<Val>>, opset: i64, base_dir: Option<&'a Path>) -> Self {
        OnnxNode { proto, inputs, opset, base_dir, used: RefCell::new(BTreeSet::new()) }
    }

    /// Required input `i`.
    pub fn input(&self, i: usize) -> Result<&Val, String> {
        self.inputs.get(i).and_then(Option::as_ref).ok_or_else(|| format!("input {i} is required"))
    }

    /// Optional input `i`.
    pub fn opt_input(&self, i: usize) -> Option<&Val> {
        self.inputs.get(i).and_then(Option::as_ref)
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

    /// Marks attributes as understood without reading them (they do not affect inference results).
    pub fn ignore(&self, names: &[&str]) {
        for n in names {
            self.attr(n);
        }
    }

    /// An integer attribute.
    pub fn int(&self, name: &str, default: i64) -> i64 {
        self.attr(name).map_or(default, |a| a.i)
    }

    /// An integer attribute without a default.
    pub fn opt_int(&self, name: &str) -> Option<i64> {
        self.attr(name).map(|a| a.i)
    }

    /// A float attribute.
    pub fn float(&self, name: &str, default: f32) -> f32 {
        self.attr(name).map_or(default, |a| a.f)
    }

    /// A float attribute without a default.
    pub fn opt_float(&self, name: &str) -> Option<f32> {
        self.attr(name).map(|a| a.f)
    }

    /// An integer-list attribute.
    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.attr(name).map(|a| a.ints.clone())
    }

    /// A float-list attribute.
    pub fn floats(&self, name: &str) -> Option<Vec<f32>> {
        self.attr(name).map(|a| a.floats.clone())
    }

    /// A string attribute.
    pub fn string(&self, name: &str) -> Option<String> {
        self.attr(name).map(|a| String::from_utf8_lossy(&a.s).into_owned())
    }

    /// A string-list attribute.
    pub fn strings(&self, name: &str) -> Option<Vec<String>> {
        self.attr(name).map(|a| a.strings.iter().map(|s| String::from_utf8_lossy(s).into_owned()).collect())
    }

    /// A tensor attribute.
    pub fn tensor(&self, name: &str) -> Result<Option<Tensor>, String> {
        match self.attr(name) {
            Some(a) => a.t.as_ref().map(|t| tensor_from_proto(t, self.base_dir)).transpose(),
            None => Ok(None),
        }
    }

    /// A graph attribute.
    pub fn graph(&self, name: &str) -> Option<&'a GraphProto> {
        self.attr(name).and_then(|a| a.g.as_ref())
    }

    /// Attributes present on the node that no one read.
    pub fn unread_attributes(&self) -> Vec<String> {
        let used = self.used.borrow();
        self.proto.attribute.iter().filter(|a| !used.contains(&a.name)).map(|a| a.name.clone()).collect()
    }
}
