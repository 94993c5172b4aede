//! [`TransferBackend`] on the CPU: promote turns a [`HostBuffer`] into a [`CpuWeight`] (typed storage, and for
//! [`Layout::PackedGemm`] the 64-byte aligned panel form `matmul_packed_f32` reads); demote turns a weight back
//! into a host buffer, unpacking the panels of a packed weight.
//!
//! Both copy on the calling thread and return a completion that is already complete — exactly, because the
//! copy has finished when they return. They do not go through the executor's lane: the host buffer is only
//! borrowed for the call, and a CPU weight is immutable (`Arc`), so no earlier work on any lane can still be
//! writing the bytes being read.

use std::sync::Arc;

use kiln_ir::{DType, Tensor};

use crate::RunError;
use crate::contract::TransferBackend;
use crate::cpu::{CpuBackend, CpuCompletion, CpuExecutor, CpuWeight};

/// How a weight is laid out in execution storage.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// Plain row-major elements.
    #[default]
    Plain,
    /// Row-major elements plus the GEMM panel form (2-D f32 only).
    PackedGemm,
}

/// Host storage of one weight: little-endian row-major bytes, their dtype and shape, and the layout the weight
/// has (or should get) in execution storage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostBuffer {
    /// The element type.
    pub dtype: DType,
    /// The extents.
    pub shape: Vec<usize>,
    /// `elements × dtype size` bytes.
    pub bytes: Vec<u8>,
    /// The execution layout.
    pub layout: Layout,
}

impl HostBuffer {
    /// A plain host buffer holding a copy of `tensor`.
    pub fn from_tensor(tensor: &Tensor) -> HostBuffer {
        HostBuffer {
            dtype: tensor.dtype(),
            shape: tensor.shape().to_vec(),
            bytes: tensor.as_bytes().to_vec(),
            layout: Layout::Plain,
        }
    }
}

fn transfer_error(message: String) -> RunError {
    RunError::Submission(format!("transfer: {message}"))
}

impl TransferBackend for CpuBackend {
    type HostBuffer = HostBuffer;
    type Transfer = CpuCompletion;
    type TransferError = RunError;

    fn promote(_executor: &CpuExecutor, host: &HostBuffer) -> Result<(CpuWeight, CpuCompletion), RunError> {
        let shown = || format!("{} {:?}", host.dtype, host.shape);
        let elements = host.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if elements.and_then(|n| n.checked_mul(host.dtype.size_bytes())) != Some(host.bytes.len()) {
            return Err(transfer_error(format!("{} bytes do not hold {}", host.bytes.len(), shown())));
        }
        if host.dtype == DType::Bool && host.bytes.iter().any(|&b| b > 1) {
            return Err(transfer_error(format!("{}: a bool byte is neither 0 nor 1", shown())));
        }
        let tensor = Tensor::from_bytes(host.dtype, host.shape.clone(), &host.bytes)
            .ok_or_else(|| transfer_error(format!("{} bytes do not hold {}", host.bytes.len(), shown())))?;
        let weight = CpuWeight::new(Arc::new(tensor));
        let weight = match host.layout {
            Layout::Plain => weight,
            Layout::PackedGemm => weight.pack("(promoted)").map_err(|e| transfer_error(e.to_string()))?,
        };
        Ok((weight, CpuCompletion::ready(Ok(()))))
    }

    fn demote(_executor: &CpuExecutor, weight: &CpuWeight) -> Result<(HostBuffer, CpuCompletion), RunError> {
        let t = weight.tensor();
        let host = match weight.packed() {
            // The packed form is the execution storage the products read: demote that, not the plain copy.
            Some(p) => HostBuffer {
                dtype: DType::F32,
                shape: vec![p.k(), p.n()],
                bytes: p.unpack().iter().flat_map(|x| x.to_le_bytes()).collect(),
                layout: Layout::PackedGemm,
            },
            None => HostBuffer::from_tensor(t),
        };
        Ok((host, CpuCompletion::ready(Ok(()))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Completion;

    fn round_trip(host: &HostBuffer) -> HostBuffer {
        let lane = CpuExecutor::new("transfer-test").unwrap();
        let (weight, up) = CpuBackend::promote(&lane, host).unwrap();
        assert!(up.is_complete(), "a CPU promote is complete when it returns");
        up.wait().unwrap();
        let (back, down) = CpuBackend::demote(&lane, &weight).unwrap();
        down.wait().unwrap();
        back
    }

    #[test]
    fn round_trips_are_bit_exact() {
        let specials = [0.0f32, -0.0, f32::from_bits(0x7fc0_0001), f32::from_bits(0xffa0_beef), f32::INFINITY, 1e-45];
        let f32s = Tensor::from_vec(vec![2, 3], specials.to_vec()).unwrap();
        let f16s =
            Tensor::from_vec(vec![3], vec![half::f16::from_bits(0x7e01), half::f16::NEG_ZERO, half::f16::MAX]).unwrap();
        let i64s = Tensor::from_vec(vec![2, 2], vec![i64::MIN, -1, 0, i64::MAX]).unwrap();
        let bools = Tensor::from_vec(vec![2], vec![true, false]).unwrap();
        for t in [&f32s, &f16s, &i64s, &bools] {
            let host = HostBuffer::from_tensor(t);
            assert_eq!(round_trip(&host), host, "{}", t.tensor_type());
        }
        // A packed matrix wider than one panel, with NaN payloads and -0.0, comes back from the panels exactly.
        let values: Vec<f32> = (0..5 * 37)
            .map(|i| match i % 7 {
                0 => -0.0,
                1 => f32::from_bits(0x7f80_0000 | i as u32),
                _ => i as f32 * 0.37 - 11.0,
            })
            .collect();
        let matrix = Tensor::from_vec(vec![5, 37], values).unwrap();
        let host = HostBuffer { layout: Layout::PackedGemm, ..HostBuffer::from_tensor(&matrix) };
        let lane = CpuExecutor::new("transfer-test").unwrap();
        let (weight, _) = CpuBackend::promote(&lane, &host).unwrap();
        assert_eq!(weight.packed().map(|p| (p.k(), p.n())), Some((5, 37)));
        assert_eq!(round_trip(&host), host);
    }

    #[test]
    fn bad_host_buffers_are_errors() {
        let lane = CpuExecutor::new("transfer-test").unwrap();
        let short = HostBuffer { dtype: DType::F32, shape: vec![2, 2], bytes: vec![0; 12], layout: Layout::Plain };
        let err = CpuBackend::promote(&lane, &short).err().unwrap().to_string();
        assert!(err.contains("12 bytes do not hold f32 [2, 2]"), "{err}");
        let vector = HostBuffer {
            layout: Layout::PackedGemm,
            ..HostBuffer::from_tensor(&Tensor::from_vec(vec![4], vec![1.0f32; 4]).unwrap())
        };
        let err = CpuBackend::promote(&lane, &vector).err().unwrap().to_string();
        assert!(err.contains("cannot be packed as a GEMM operand"), "{err}");
        let bools = HostBuffer { dtype: DType::Bool, shape: vec![1], bytes: vec![9], layout: Layout::Plain };
        assert!(CpuBackend::promote(&lane, &bools).is_err());
    }
}
