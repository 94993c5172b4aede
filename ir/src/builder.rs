//! The builder: graphs from Rust code, typed as they are built.
//!
//! ```
//! use kiln_ir::{Builder, DType, Shape, Dim};
//! let mut b = Builder::new("mlp");
//! let x = b.input("x", DType::F32, Shape(vec![Dim::sym("batch"), Dim::Static(4)]))?;
//! let w = b.param("w", DType::F32, Shape::of(&[4, 2]))?;
//! let h = b.matmul(x, w)?;
//! let y = b.relu(h)?;
//! b.output("y", y);
//! let g = b.finish();
//! # Ok::<(), kiln_ir::Error>(())
//! ```
//!
//! Every op goes through [`infer`](crate::infer::infer); a type error names the op and the node.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::Error;
use crate::graph::{Graph, Node, Value};
use crate::infer::infer;
use crate::op::*;
use crate::tensor::Tensor;
use crate::types::{DType, Shape, TensorType};

/// Constants with at most this many elements stay inline in the IR; larger ones become named weights.
pub const INLINE_CONSTANT_LIMIT: usize = 64;

/// Builds a [`Graph`] with type inference at each step.
pub struct Builder {
    graph: Graph,
    next_const: usize,
    /// Names of the graph's `param` nodes, kept so each declaration checks uniqueness without a scan.
    param_names: BTreeSet<String>,
}

impl Builder {
    /// A builder for a graph called `name`.
    pub fn new(name: impl Into<String>) -> Builder {
        Builder::from_graph(Graph::new(name))
    }

    /// Continues building on an existing graph.
    pub fn from_graph(graph: Graph) -> Builder {
        let param_names = graph
            .params()
            .filter_map(|id| match &graph.node(id).op {
                Op::Parameter(p) => Some(p.name.clone()),
                _ => None,
            })
            .collect();
        Builder { graph, next_const: 0, param_names }
    }

    /// The graph so far.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The type of a value built here.
    pub fn type_of(&self, v: Value) -> Result<&TensorType, Error> {
        self.graph.value_type(v).ok_or_else(|| Error::Build {
            op: "?".into(),
            node: None,
            message: format!("value {}#{} does not exist", v.node, v.index),
        })
    }

    /// Finishes, returning the graph.
    pub fn finish(self) -> Graph {
        self.graph
    }

    /// Declares a named graph input.
    pub fn input(&mut self, name: &str, dtype: DType, shape: Shape) -> Result<Value, Error> {
        if self.graph.inputs().iter().any(|&i| matches!(&self.graph.node(i).op, Op::Input(inp) if inp.name == name)) {
            return Err(Error::Build {
                op: "input".into(),
                node: Some(name.into()),
                message: "an input with this name already exists".into(),
            });
        }
        Ok(self.source(Op::Input(Input { name: name.into() }), TensorType::new(dtype, shape)))
    }

    /// Declares a named weight without data (bind it later through `graph.weights`).
    pub fn param(&mut self, name: &str, dtype: DType, shape: Shape) -> Result<Value, Error> {
        self.claim_param_name(name)?;
        Ok(self.source(Op::Parameter(Parameter { name: name.into() }), TensorType::new(dtype, shape)))
    }

    /// Declares a named weight and stores its data.
    pub fn weight(&mut self, name: &str, value: impl Into<Arc<Tensor>>) -> Result<Value, Error> {
        // Checked before storing: the data would otherwise replace the existing parameter's.
        self.claim_param_name(name)?;
        let value = value.into();
        let ty = value.tensor_type();
        self.graph.weights.insert(name, value);
        Ok(self.source(Op::Parameter(Parameter { name: name.into() }), ty))
    }

    /// A constant: inline when small, otherwise stored as a weight named `const.N`.
    pub fn constant(&mut self, value: Tensor) -> Result<Value, Error> {
        if value.len() <= INLINE_CONSTANT_LIMIT {
            let ty = value.tensor_type();
            return Ok(self.source(Op::Constant(Constant { value }), ty));
        }
        let name = loop {
            let n = format!("const.{}", self.next_const);
            self.next_const += 1;
            if self.graph.weights.get(&n).is_none() && !self.param_names.contains(&n) {
                break n;
            }
        };
        self.weight(&name, value)
    }

    /// Records a new parameter name; names are unique (the verifier requires it), so a repeat is an error.
    fn claim_param_name(&mut self, name: &str) -> Result<(), Error> {
        if self.param_names.contains(name) {
            return Err(Error::Build {
                op: "param".into(),
                node: Some(name.into()),
                message: "a parameter with this name already exists".into(),
            });
        }
        self.param_names.insert(name.into());
        Ok(())
    }

    /// A scalar constant of `dtype` holding `v` (converted as `cast` does).
    pub fn scalar(&mut self, dtype: DType, v: f64) -> Result<Value, Error> {
        let t =
            Tensor::new(vec![], crate::tensor::Data::from_f64_iter(dtype, std::iter::once(v))).expect("one element");
        self.constant(t)
    }

    fn source(&mut self, op: Op, ty: TensorType) -> Value {
        Value::new(self.graph.add_node(Node { op, inputs: vec![], outputs: vec![ty], name: None }), 0)
    }

    /// Adds any op, inferring its result types; returns all results.
    pub fn op_multi(&mut self, op: Op, inputs: &[Value]) -> Result<Vec<Value>, Error> {
        self.named_op(op, inputs, None)
    }

    /// Adds an op with a debug name (for messages), inferring its result types.
    pub fn named_op(&mut self, op: Op, inputs: &[Value], name: Option<String>) -> Result<Vec<Value>, Error> {
        let types = inputs.iter().map(|&v| self.type_of(v).cloned()).collect::<Result<Vec<_>, _>>()?;
        let outputs = infer(&op, &types).map_err(|message| Error::Build {
            op: op.mnemonic().into(),
            node: name.clone(),
            message,
        })?;
        let n = outputs.len();
        let id = self.graph.add_node(Node { op, inputs: inputs.to_vec(), outputs, name });
        Ok((0..n as u32).map(|i| Value::new(id, i)).collect())
    }

    /// Adds a single-result op.
    pub fn op(&mut self, op: Op, inputs: &[Value]) -> Result<Value, Error> {
        let mnemonic = op.mnemonic();
        let vs = self.op_multi(op, inputs)?;
        match vs.as_slice() {
            [v] => Ok(*v),
            _ => Err(Error::Build {
                op: mnemonic.into(),
                node: None,
                message: format!("has {} results; use op_multi", vs.len()),
            }),
        }
    }

    /// Marks `v` as the graph output `name`.
    pub fn output(&mut self, name: &str, v: Value) {
        self.graph.add_output(name, v);
    }

    /// An elementwise unary op.
    pub fn unary(&mut self, kind: UnaryOp, x: Value) -> Result<Value, Error> {
        self.op(Op::Unary(kind), &[x])
    }

    /// An elementwise binary op (broadcasting).
    pub fn binary(&mut self, kind: BinaryOp, a: Value, b: Value) -> Result<Value, Error> {
        self.op(Op::Binary(kind), &[a, b])
    }

    /// `cast(x)` to `to`.
    pub fn cast(&mut self, x: Value, to: DType) -> Result<Value, Error> {
        self.op(Op::Cast(Cast { to }), &[x])
    }

    /// `select(cond, a, b)`.
    pub fn select(&mut self, cond: Value, a: Value, b: Value) -> Result<Value, Error> {
        self.op(Op::Select, &[cond, a, b])
    }

    /// A reduction.
    pub fn reduce(&mut self, kind: ReduceKind, x: Value, axes: &[i64], keep_dims: bool) -> Result<Value, Error> {
        self.op(Op::Reduce(Reduce { kind, axes: axes.to_vec(), keep_dims }), &[x])
    }

    /// Batched matrix product.
    pub fn matmul(&mut self, a: Value, b: Value) -> Result<Value, Error> {
        self.op(Op::MatMul, &[a, b])
    }

    /// Reshape to a target shape.
    pub fn reshape(&mut self, x: Value, shape: Shape) -> Result<Value, Error> {
        self.op(Op::Reshape(Reshape { shape }), &[x])
    }

    /// Transpose by `perm`.
    pub fn transpose(&mut self, x: Value, perm: &[i64]) -> Result<Value, Error> {
        self.op(Op::Transpose(Transpose { perm: perm.to_vec() }), &[x])
    }

    /// Softmax along `axis`.
    pub fn softmax(&mut self, x: Value, axis: i64) -> Result<Value, Error> {
        self.op(Op::Softmax(Softmax { axis }), &[x])
    }
}

macro_rules! unary_methods {
    ($($name:ident => $kind:ident),* $(,)?) => {
        impl Builder {
            $(
                #[doc = concat!("Elementwise `", stringify!($name), "`.")]
                pub fn $name(&mut self, x: Value) -> Result<Value, Error> {
                    self.unary(UnaryOp::$kind, x)
                }
            )*
        }
    };
}

macro_rules! binary_methods {
    ($($name:ident => $kind:ident),* $(,)?) => {
        impl Builder {
            $(
                #[doc = concat!("Elementwise `", stringify!($name), "` with broadcasting.")]
                pub fn $name(&mut self, a: Value, b: Value) -> Result<Value, Error> {
                    self.binary(BinaryOp::$kind, a, b)
                }
            )*
        }
    };
}

unary_methods!(neg => Neg, abs => Abs, exp => Exp, log => Log, sqrt => Sqrt, rsqrt => Rsqrt, tanh => Tanh,
    sigmoid => Sigmoid, erf => Erf, relu => Relu);
binary_methods!(add => Add, sub => Sub, mul => Mul, div => Div, pow => Pow, max => Max, min => Min);
