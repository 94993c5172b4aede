//! Executables for accelerators: what the CUDA backend runs.
//!
//! An [`Executable`]'s steps assume the CPU's native library for `matmul`, `conv`, `pool` and `gather`. A device
//! has a GEMM library (cuBLAS) and nothing else, so [`build_plan`] rewrites each library step into device
//! steps over the same buffers:
//! - `matmul` stays one [`DeviceStep::MatMul`]: a (strided, batched) GEMM whose layout comes from
//!   [`crate::library::batch_plan`] at run time, the same broadcasting rule the CPU follows;
//! - `conv` with one group becomes [`DeviceStep::Conv`]: the output pre-filled with the bias (a
//!   [`builtin::bias_fill`] kernel) or zeros, the im2col matrix of every image (a [`builtin::im2col`] kernel into
//!   a per-run scratch buffer; skipped for a 1×1, stride-1, unpadded conv, whose input already is that matrix),
//!   then one GEMM per batch of images accumulating into the output;
//! - a grouped conv (depthwise included) becomes a [`builtin::conv_direct`] kernel, `pool` a [`builtin::pool`]
//!   kernel, both plain [`DeviceStep::Kernel`]s;
//! - `gather` becomes [`DeviceStep::Gather`]: its indices are checked on the host first (an out-of-range index
//!   is an error, as in the interpreter, not a clamped read), then a [`builtin::gather`] kernel runs;
//! - an epilogue kernel follows its library step as a [`DeviceStep::Kernel`];
//! - an interpreter fallback becomes [`DeviceStep::Host`]: its operands are copied to the host, the reference
//!   interpreter runs, its results are copied back.
//!
//! The builtin kernels are appended to the executable's kernels ([`DevicePlan::kernels`]: the executable's
//! first, at their own indices), so one PTX module holds them all and the emulator checks them as it checks any
//! other kernel. Identical builtins (same text) are built once.

use std::collections::HashMap;

use kiln_ir::TensorType;
use kiln_ir::op::Conv;

pub use kiln_plan::device::*;

use crate::exec::{BufferId, Executable, LibraryOp, Routine, Step};
use crate::kernel::{self, Kernel, LowerError, builtin};

/// Builds the device plan of `exe` (which keeps its kernels: they come first in [`DevicePlan::kernels`]).
pub fn build_plan(exe: &Executable) -> Result<DevicePlan, LowerError> {
    let mut b = PlanBuilder { exe, kernels: exe.kernels.clone(), index: HashMap::new() };
    let prepare = b.steps(&exe.prepare)?;
    let steps = b.steps(&exe.steps)?;
    // The builtins are hand-built kernel IR: verified once here, like lowered kernels.
    for k in &b.kernels[exe.kernels.len()..] {
        kernel::verify_message(k).map_err(|reason| LowerError::NotLowerable {
            node: k.name.clone(),
            reason: format!("malformed builtin (a kiln bug): {reason}"),
        })?;
    }
    // Host routines of the CPU library run on the device's host through the interpreter: fallbacks there.
    let mut fallbacks = exe.fallbacks.clone();
    // Compiled region bodies are the CPU's: on a device the whole region runs on the host's interpreter (the
    // fallbacks inside its bodies are subsumed by it).
    fallbacks.retain(|f| f.region.is_none());
    for s in exe.prepare.iter().chain(&exe.steps) {
        let (op, node) = match s {
            Step::Routine { routine, node, .. } if !routine.runs_as_device_kernel() => (routine.op(), node),
            Step::Region { op, node, .. } => (op.clone(), node),
            _ => continue,
        };
        let op = op.mnemonic().to_string();
        let why = format!("the device has no `{op}` yet: it runs on the host's reference interpreter");
        fallbacks.push(kiln_plan::exec::Fallback { op, node: node.clone(), why, region: None });
    }
    let plan = DevicePlan { prepare, steps, kernels: b.kernels, fallbacks };
    // The same verifier an artifact's plan goes through when it is loaded.
    let sigs = kiln_plan::verify::signatures(&plan.kernels);
    kiln_plan::verify::verify_device_plan(exe, &plan, &kiln_plan::verify::borrowed(&sigs)).map_err(|reason| {
        LowerError::NotLowerable {
            node: exe.name.clone(),
            reason: format!("the device plan does not verify (a kiln bug): {reason}"),
        }
    })?;
    Ok(plan)
}

/// The im2col matrix `[N, Cin·∏window, ∏out spatial]` of a conv of `x` by `w` into `out`.
fn im2col_type(x: &TensorType, w: &TensorType, out: &TensorType) -> Result<TensorType, LowerError> {
    let product = |dims: &[kiln_ir::Dim]| -> Result<kiln_ir::Dim, LowerError> {
        builtin::dim_product(dims).ok_or_else(|| LowerError::NotLowerable {
            node: "conv".into(),
            reason: format!("the im2col matrix of {x} by {w} does not fit"),
        })
    };
    let (rows, cols) = (product(&w.shape.0[1..])?, product(out.shape.0.get(2..).unwrap_or_default())?);
    Ok(TensorType::new(x.dtype, kiln_ir::Shape(vec![x.shape.0[0].clone(), rows, cols])))
}

/// Whether a convolution reads its input as its own im2col matrix: a 1×1 window, stride 1, no padding.
fn is_pointwise(conv: &Conv, w: &TensorType) -> bool {
    let window_one = w.shape.0[2..].iter().all(|d| d.as_static() == Some(1));
    window_one && conv.strides.iter().all(|&s| s == 1) && conv.pads.iter().all(|&p| p == 0)
}

struct PlanBuilder<'e> {
    exe: &'e Executable,
    kernels: Vec<Kernel>,
    /// Builtin kernel text (name blanked) → index.
    index: HashMap<String, usize>,
}

impl PlanBuilder<'_> {
    fn ty(&self, b: BufferId) -> &TensorType {
        &self.exe.buffers[b.0 as usize].ty
    }

    /// Adds a builtin kernel (or finds its twin) and returns its index.
    fn builtin(&mut self, mut k: Kernel) -> usize {
        let key = kernel::print(&Kernel { name: String::new(), ..k.clone() });
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        k.name = format!("{}_{}", k.name, self.kernels.len());
        self.kernels.push(k);
        self.index.insert(key, self.kernels.len() - 1);
        self.kernels.len() - 1
    }

    fn steps(&mut self, steps: &[Step]) -> Result<Vec<DeviceStep>, LowerError> {
        let mut out = Vec::with_capacity(steps.len());
        for s in steps {
            self.step(s, &mut out)?;
        }
        Ok(out)
    }

    fn step(&mut self, s: &Step, out: &mut Vec<DeviceStep>) -> Result<(), LowerError> {
        match s {
            Step::Kernel { kernel, args } => out.push(DeviceStep::Kernel { kernel: *kernel, args: args.clone() }),
            Step::Copy { src, dst } => out.push(DeviceStep::Copy { src: *src, dst: *dst }),
            // The recurrent routines are the CPU library's: on a device they run on the host, as a fallback
            // (recorded in the device plan's fallbacks by `compile`).
            Step::Routine { routine, inputs, outputs, node } => match self.routine_kernel(routine, inputs, outputs)? {
                Some(step) => out.push(step),
                None => out.push(DeviceStep::Host {
                    backend: None,
                    op: routine.op(),
                    inputs: inputs.clone(),
                    outputs: outputs.clone(),
                    node: node.clone(),
                }),
            },
            Step::Interp { op, inputs, outputs, node } | Step::Region { op, inputs, outputs, node, .. } => {
                out.push(DeviceStep::Host {
                    backend: None,
                    op: op.clone(),
                    inputs: inputs.clone(),
                    outputs: outputs.clone(),
                    node: node.clone(),
                })
            }
            Step::Backend { backend, op, inputs, outputs, node } => out.push(DeviceStep::Host {
                backend: Some(backend.clone()),
                op: op.clone(),
                inputs: inputs.clone(),
                outputs: outputs.clone(),
                node: node.clone(),
            }),
            Step::Library { op, inputs, output, epilogue } => {
                out.push(self.library(op, inputs, *output)?);
                if let Some(e) = epilogue {
                    self.step(e, out)?;
                }
            }
        }
        Ok(())
    }

    /// A library op the device has no native form of, as `op` lowered to a kernel of its own.
    fn single_op(
        &mut self,
        name: &str,
        op: &kiln_ir::Op,
        inputs: &[BufferId],
        output: BufferId,
    ) -> Result<DeviceStep, LowerError> {
        let tys: Vec<TensorType> = inputs.iter().map(|&b| self.ty(b).clone()).collect();
        let (k, bound) = builtin::single_op(name, op, &tys, self.ty(output))?;
        Ok(self.bound_kernel(k, &bound, inputs, &[output]))
    }

    /// Kernel `k` launched with the buffers its arguments bind (`bound`, from the builtins).
    fn bound_kernel(
        &mut self,
        k: Kernel,
        bound: &[builtin::Bound],
        inputs: &[BufferId],
        outputs: &[BufferId],
    ) -> DeviceStep {
        let args = bound
            .iter()
            .map(|b| match *b {
                builtin::Bound::Operand(i) => inputs[i],
                builtin::Bound::Result(i) => outputs[i],
            })
            .collect();
        DeviceStep::Kernel { kernel: self.builtin(k), args }
    }

    /// A routine of the CPU library that a device runs as a kernel: its primitive expansion lowered to one
    /// ([`builtin::expanded_op`]); `None` for the routines that run on the host.
    fn routine_kernel(
        &mut self,
        routine: &Routine,
        inputs: &[BufferId],
        outputs: &[BufferId],
    ) -> Result<Option<DeviceStep>, LowerError> {
        match routine {
            Routine::DynamicQuantize => {
                let ins: Vec<TensorType> = inputs.iter().map(|&b| self.ty(b).clone()).collect();
                let outs: Vec<TensorType> = outputs.iter().map(|&b| self.ty(b).clone()).collect();
                let (k, bound) = builtin::expanded_op("dynamic_quantize", &ins, &outs, |g, x| {
                    Ok(kiln_ir::quant::expand_dynamic_quantize(g, x[0])?.to_vec())
                })?;
                Ok(Some(self.bound_kernel(k, &bound, inputs, outputs)))
            }
            _ => Ok(None),
        }
    }

    fn library(&mut self, op: &LibraryOp, inputs: &[BufferId], output: BufferId) -> Result<DeviceStep, LowerError> {
        let out_ty = self.ty(output).clone();
        match op {
            LibraryOp::MatMul => Ok(DeviceStep::MatMul { a: inputs[0], b: inputs[1], out: output }),
            LibraryOp::Conv(c) => {
                let (x, w, bias) = (inputs[0], inputs[1], inputs.get(2).copied());
                let (xt, wt) = (self.ty(x).clone(), self.ty(w).clone());
                let bias_ty = bias.map(|b| self.ty(b).clone());
                if c.groups != 1 {
                    let k = builtin::conv_direct("conv_direct", &xt, &wt, bias_ty.as_ref(), c, &out_ty)?;
                    let args = [x, w].into_iter().chain(bias).chain([output]).collect();
                    return Ok(DeviceStep::Kernel { kernel: self.builtin(k), args });
                }
                let bias = match (bias, &bias_ty) {
                    (Some(b), Some(bt)) => Some((b, self.builtin(builtin::bias_fill("bias_fill", bt, &out_ty)?))),
                    _ => None,
                };
                let im2col = if is_pointwise(c, &wt) {
                    None
                } else {
                    let col = im2col_type(&xt, &wt, &out_ty)?;
                    Some(self.builtin(builtin::im2col("im2col", &xt, &wt, c, &col)?))
                };
                Ok(DeviceStep::Conv { x, w, bias, out: output, im2col })
            }
            LibraryOp::ConvTranspose(c) => {
                let (xt, wt) = (self.ty(inputs[0]).clone(), self.ty(inputs[1]).clone());
                let bias_ty = inputs.get(2).map(|&b| self.ty(b).clone());
                let k = builtin::conv_transpose("conv_transpose", &xt, &wt, bias_ty.as_ref(), c, &out_ty)?;
                let args = inputs.iter().copied().chain([output]).collect();
                Ok(DeviceStep::Kernel { kernel: self.builtin(k), args })
            }
            LibraryOp::Softmax { axis, log } => {
                self.single_op("softmax", &LibraryOp::softmax_op(*axis, *log), inputs, output)
            }
            LibraryOp::Concat(c) => self.single_op("concat", &kiln_ir::Op::Concat(c.clone()), inputs, output),
            LibraryOp::Pool(p) => {
                let k = builtin::pool("pool", self.ty(inputs[0]), p, &out_ty)?;
                Ok(DeviceStep::Kernel { kernel: self.builtin(k), args: vec![inputs[0], output] })
            }
            LibraryOp::MatMulInteger | LibraryOp::ConvInteger(_) => {
                let [a, b, az, bz] = inputs else {
                    return Err(LowerError::NotLowerable {
                        node: "integer product".into(),
                        reason: format!("{} operands, not 4", inputs.len()),
                    });
                };
                let (a, b, az, bz) = (self.ty(*a), self.ty(*b), self.ty(*az), self.ty(*bz));
                let k = match op {
                    LibraryOp::ConvInteger(c) => builtin::conv_integer("conv_integer", a, b, (az, bz), c, &out_ty)?,
                    _ => builtin::matmul_integer("matmul_integer", a, b, (az, bz), &out_ty)?,
                };
                let args = inputs.iter().copied().chain([output]).collect();
                Ok(DeviceStep::Kernel { kernel: self.builtin(k), args })
            }
            LibraryOp::Gather(g) => {
                let (data, indices) = (inputs[0], inputs[1]);
                let rank = self.ty(data).shape.rank();
                let axis = kiln_ir::types::normalize_axis(g.axis, rank)
                    .map_err(|reason| LowerError::NotLowerable { node: "gather".into(), reason })?;
                let k = builtin::gather("gather", self.ty(data), self.ty(indices), g, &out_ty)?;
                Ok(DeviceStep::Gather { kernel: self.builtin(k), data, indices, out: output, axis })
            }
        }
    }
}
