//! Building small ONNX models in Rust for the importer's tests: a [`ModelBuilder`] over `onnx-protobuf`'s message
//! types, plus free functions for nodes, attributes and tensors.
//!
//! Dims are written as strings, `"3"` for a static extent and `"batch"` for a `dim_param`, so a case reads like the
//! model it describes. Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::tensor_proto::DataLocation;
use onnx_protobuf::tensor_shape_proto::{Dimension, dimension};
use onnx_protobuf::{
    AttributeProto, GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto, type_proto,
};

/// ONNX `TensorProto.DataType` codes used by the tests.
pub mod dtype {
    pub const FLOAT: i32 = 1;
    pub const UINT8: i32 = 2;
    pub const COMPLEX64: i32 = 14;
    pub const INT64: i32 = 7;
    pub const STRING: i32 = 8;
    pub const BOOL: i32 = 9;
}

/// A graph under construction, serialized as a model with one default-domain opset.
#[derive(Clone)]
pub struct ModelBuilder {
    graph: GraphProto,
    opset: i64,
}

impl ModelBuilder {
    /// An empty graph named `name`, at opset 17.
    pub fn new(name: &str) -> ModelBuilder {
        let mut graph = GraphProto::new();
        graph.name = name.to_string();
        ModelBuilder { graph, opset: 17 }
    }

    /// The default-domain opset the model imports.
    pub fn opset(mut self, version: i64) -> Self {
        self.opset = version;
        self
    }

    /// A tensor input; each dim is an integer extent or a `dim_param` name.
    pub fn input(mut self, name: &str, elem_type: i32, dims: &[&str]) -> Self {
        self.graph.input.push(value_info(name, elem_type, Some(dims)));
        self
    }

    /// A tensor input without a declared shape.
    pub fn input_without_shape(mut self, name: &str, elem_type: i32) -> Self {
        self.graph.input.push(value_info(name, elem_type, None));
        self
    }

    /// A `value_info` entry declaring `name`'s element type and shape.
    pub fn value_info(mut self, name: &str, elem_type: i32, dims: &[&str]) -> Self {
        self.graph.value_info.push(value_info(name, elem_type, Some(dims)));
        self
    }

    /// A graph output with a declared type.
    pub fn output_typed(mut self, name: &str, elem_type: i32, dims: &[&str]) -> Self {
        self.graph.output.push(value_info(name, elem_type, Some(dims)));
        self
    }

    /// A graph output with no declared type (so the importer checks only its name).
    pub fn output(mut self, name: &str) -> Self {
        let mut vi = ValueInfoProto::new();
        vi.name = name.to_string();
        self.graph.output.push(vi);
        self
    }

    /// A node.
    pub fn node(mut self, n: NodeProto) -> Self {
        self.graph.node.push(n);
        self
    }

    /// An initializer.
    pub fn initializer(mut self, t: TensorProto) -> Self {
        self.graph.initializer.push(t);
        self
    }

    /// The graph alone (an `If` branch, say).
    pub fn graph(&self) -> GraphProto {
        self.graph.clone()
    }

    /// The model.
    pub fn model(&self) -> ModelProto {
        let mut m = ModelProto::new();
        m.ir_version = 8;
        m.producer_name = "kiln-tests".into();
        let mut op = OperatorSetIdProto::new();
        op.version = self.opset;
        m.opset_import.push(op);
        m.graph = Some(self.graph.clone()).into();
        m
    }

    /// The model's protobuf bytes.
    pub fn bytes(&self) -> Vec<u8> {
        self.model().write_to_bytes().expect("a model built in memory serializes")
    }
}

fn value_info(name: &str, elem_type: i32, dims: Option<&[&str]>) -> ValueInfoProto {
    let mut tt = type_proto::Tensor::new();
    tt.elem_type = elem_type;
    if let Some(dims) = dims {
        let mut shape = TensorShapeProto::new();
        for d in dims {
            let mut dim = Dimension::new();
            dim.value = Some(match d.parse::<i64>() {
                Ok(n) => dimension::Value::DimValue(n),
                Err(_) => dimension::Value::DimParam(d.to_string()),
            });
            shape.dim.push(dim);
        }
        tt.shape = Some(shape).into();
    }
    let mut ty = TypeProto::new();
    ty.value = Some(type_proto::Value::TensorType(tt));
    let mut vi = ValueInfoProto::new();
    vi.name = name.to_string();
    vi.type_ = Some(ty).into();
    vi
}

/// A default-domain node `name` computing `outputs` from `inputs` (`""` for an omitted optional input).
pub fn node(name: &str, op_type: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    let mut n = NodeProto::new();
    n.name = name.to_string();
    n.op_type = op_type.to_string();
    n.input = inputs.iter().map(|s| s.to_string()).collect();
    n.output = outputs.iter().map(|s| s.to_string()).collect();
    n
}

/// `n` with attribute `a` added.
pub fn with_attr(mut n: NodeProto, a: AttributeProto) -> NodeProto {
    n.attribute.push(a);
    n
}

fn attr(name: &str, ty: AttributeType) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.to_string();
    a.type_ = ty.into();
    a
}

/// An integer attribute.
pub fn attr_int(name: &str, v: i64) -> AttributeProto {
    let mut a = attr(name, AttributeType::INT);
    a.i = v;
    a
}

/// A float attribute.
pub fn attr_float(name: &str, v: f32) -> AttributeProto {
    let mut a = attr(name, AttributeType::FLOAT);
    a.f = v;
    a
}

/// A string attribute.
pub fn attr_string(name: &str, v: &str) -> AttributeProto {
    let mut a = attr(name, AttributeType::STRING);
    a.s = v.as_bytes().to_vec();
    a
}

/// An attribute of no declared type holding `f` and `s` (old files leave the type `UNDEFINED`).
pub fn attr_untyped(name: &str, f: f32, s: &str) -> AttributeProto {
    let mut a = attr(name, AttributeType::UNDEFINED);
    a.f = f;
    a.s = s.as_bytes().to_vec();
    a
}

/// An integer-list attribute.
pub fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    let mut a = attr(name, AttributeType::INTS);
    a.ints = v.to_vec();
    a
}

/// A tensor attribute.
pub fn attr_tensor(name: &str, t: TensorProto) -> AttributeProto {
    let mut a = attr(name, AttributeType::TENSOR);
    a.t = Some(t).into();
    a
}

/// A graph attribute.
pub fn attr_graph(name: &str, g: GraphProto) -> AttributeProto {
    let mut a = attr(name, AttributeType::GRAPH);
    a.g = Some(g).into();
    a
}

/// An f32 tensor in `raw_data`.
pub fn tensor_f32(name: &str, dims: &[i64], data: &[f32]) -> TensorProto {
    let mut t = TensorProto::new();
    t.name = name.to_string();
    t.data_type = dtype::FLOAT;
    t.dims = dims.to_vec();
    t.raw_data = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    t
}

/// An i64 tensor in `int64_data`.
pub fn tensor_i64(name: &str, dims: &[i64], data: &[i64]) -> TensorProto {
    let mut t = TensorProto::new();
    t.name = name.to_string();
    t.data_type = dtype::INT64;
    t.dims = dims.to_vec();
    t.int64_data = data.to_vec();
    t
}

/// A bool scalar in `int32_data`.
pub fn tensor_bool(name: &str, v: bool) -> TensorProto {
    let mut t = TensorProto::new();
    t.name = name.to_string();
    t.data_type = dtype::BOOL;
    t.int32_data = vec![v as i32];
    t
}

/// An f32 tensor whose data lives in an external file: `location`, and `offset`/`length` when given.
pub fn tensor_f32_external(name: &str, dims: &[i64], location: &str, offset: Option<u64>) -> TensorProto {
    let mut t = TensorProto::new();
    t.name = name.to_string();
    t.data_type = dtype::FLOAT;
    t.dims = dims.to_vec();
    t.data_location = DataLocation::EXTERNAL.into();
    let mut entry = |k: &str, v: String| {
        let mut kv = StringStringEntryProto::new();
        kv.key = k.to_string();
        kv.value = v;
        t.external_data.push(kv);
    };
    entry("location", location.to_string());
    if let Some(o) = offset {
        entry("offset", o.to_string());
    }
    t
}

/// A `Constant` node holding `t`.
pub fn constant(name: &str, output: &str, t: TensorProto) -> NodeProto {
    with_attr(node(name, "Constant", &[], &[output]), attr_tensor("value", t))
}

/// `y = Relu(x)` on `f32[dims]`: the smallest valid model.
pub fn relu_model(dims: &[&str]) -> ModelBuilder {
    ModelBuilder::new("relu").input("x", dtype::FLOAT, dims).node(node("relu", "Relu", &["x"], &["y"])).output("y")
}

/// `y = Relu(x @ W + b)` on `f32[batch, 4]` with initializers: a small model with every section filled, the
/// seed the mutation tests start from.
pub fn small_mlp() -> ModelBuilder {
    let w: Vec<f32> = (0..12).map(|i| i as f32 * 0.25 - 1.0).collect();
    ModelBuilder::new("mlp")
        .input("x", dtype::FLOAT, &["batch", "4"])
        .initializer(tensor_f32("w", &[4, 3], &w))
        .initializer(tensor_f32("b", &[3], &[0.5, -0.5, 0.0]))
        .node(node("matmul", "MatMul", &["x", "w"], &["xw"]))
        .node(node("add", "Add", &["xw", "b"], &["h"]))
        .node(node("relu", "Relu", &["h"], &["y"]))
        .output("y")
}

/// `y = Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1]))`: flatten all but the first dim, the way exporters
/// spell it.
pub fn flatten_chain(x_dims: &[&str]) -> ModelBuilder {
    ModelBuilder::new("flatten")
        .input("x", dtype::FLOAT, x_dims)
        .node(node("shape", "Shape", &["x"], &["s"]))
        .node(constant("zero", "k0", tensor_i64("", &[], &[0])))
        .node(with_attr(node("gather", "Gather", &["s", "k0"], &["d0"]), attr_int("axis", 0)))
        .node(constant("axes", "ax", tensor_i64("", &[1], &[0])))
        .node(node("unsqueeze", "Unsqueeze", &["d0", "ax"], &["d0v"]))
        .node(constant("minus_one", "m1", tensor_i64("", &[1], &[-1])))
        .node(with_attr(node("concat", "Concat", &["d0v", "m1"], &["target"]), attr_int("axis", 0)))
        .node(node("reshape", "Reshape", &["x", "target"], &["y"]))
        .output("y")
}

/// `y = If(cond, then: Neg(x), else: Abs(x))` with `cond` a constant.
pub fn if_model(cond: bool) -> ModelBuilder {
    let then_branch = ModelBuilder::new("then").node(node("neg", "Neg", &["x"], &["t"])).output("t").graph();
    let else_branch = ModelBuilder::new("else").node(node("abs", "Abs", &["x"], &["e"])).output("e").graph();
    let iff = with_attr(
        with_attr(node("if", "If", &["cond"], &["y"]), attr_graph("then_branch", then_branch)),
        attr_graph("else_branch", else_branch),
    );
    ModelBuilder::new("if")
        .input("x", dtype::FLOAT, &["3"])
        .node(constant("cond", "cond", tensor_bool("", cond)))
        .node(iff)
        .output("y")
}
