//! Concrete tensors: a static shape and typed, row-major element storage.
//!
//! Used for constants in the graph, weights, interpreter values and the inputs/outputs of every backend's tests.
//! Storage is one `Vec` per dtype ([`Data`]); generic code reaches the elements through [`Element`] and the
//! [`dispatch_data!`](crate::dispatch_data) macro, so adding a dtype is one arm per match.

use std::fmt;

use half::{bf16, f16};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::types::{DType, Shape, TensorType};

/// Typed element storage.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Data {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F64(Vec<f64>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
    I16(Vec<i16>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    F8E4M3FN(Vec<crate::narrow::F8E4M3FN>),
    F8E4M3FNUZ(Vec<crate::narrow::F8E4M3FNUZ>),
    F8E5M2(Vec<crate::narrow::F8E5M2>),
    F8E5M2FNUZ(Vec<crate::narrow::F8E5M2FNUZ>),
    F8E8M0(Vec<crate::narrow::F8E8M0>),
    F4E2M1(Vec<crate::narrow::F4E2M1>),
    I4(Vec<crate::narrow::I4>),
    U4(Vec<crate::narrow::U4>),
    I2(Vec<crate::narrow::I2>),
    U2(Vec<crate::narrow::U2>),
}

/// Runs `$body` with `$v` bound to the `Vec` inside a [`Data`] (or `&Data` / `&mut Data`), whatever its dtype.
#[macro_export]
macro_rules! dispatch_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::tensor::Data::F32($v) => $body,
            $crate::tensor::Data::F16($v) => $body,
            $crate::tensor::Data::BF16($v) => $body,
            $crate::tensor::Data::F64($v) => $body,
            $crate::tensor::Data::I8($v) => $body,
            $crate::tensor::Data::U8($v) => $body,
            $crate::tensor::Data::I32($v) => $body,
            $crate::tensor::Data::I64($v) => $body,
            $crate::tensor::Data::Bool($v) => $body,
            $crate::tensor::Data::I16($v) => $body,
            $crate::tensor::Data::U16($v) => $body,
            $crate::tensor::Data::U32($v) => $body,
            $crate::tensor::Data::U64($v) => $body,
            $crate::tensor::Data::F8E4M3FN($v) => $body,
            $crate::tensor::Data::F8E4M3FNUZ($v) => $body,
            $crate::tensor::Data::F8E5M2($v) => $body,
            $crate::tensor::Data::F8E5M2FNUZ($v) => $body,
            $crate::tensor::Data::F8E8M0($v) => $body,
            $crate::tensor::Data::F4E2M1($v) => $body,
            $crate::tensor::Data::I4($v) => $body,
            $crate::tensor::Data::U4($v) => $body,
            $crate::tensor::Data::I2($v) => $body,
            $crate::tensor::Data::U2($v) => $body,
        }
    };
}

/// A scalar element type that a [`Tensor`] can hold.
pub trait Element: Copy + PartialEq + PartialOrd + Default + fmt::Debug + Send + Sync + 'static {
    /// The matching dtype.
    const DTYPE: DType;
    /// Lossless for every type but i64 beyond 2^53.
    fn to_f64(self) -> f64;
    /// Conversion with the semantics of `cast` (saturating for floats to ints, NaN to 0, wrapping never).
    fn from_f64(v: f64) -> Self;
    /// Exact integer view, for integer and bool types (floats truncate toward zero).
    fn to_i64(self) -> i64;
    /// Exact conversion from an integer (wrapping for narrower integer types, as C casts do).
    fn from_i64(v: i64) -> Self;
    /// Wraps a vector as storage.
    fn wrap(v: Vec<Self>) -> Data;
    /// The vector inside storage of this dtype.
    fn unwrap(d: &Data) -> Option<&Vec<Self>>;
    /// Mutable access to storage of this dtype.
    fn unwrap_mut(d: &mut Data) -> Option<&mut Vec<Self>>;
    /// Little-endian bytes of one element.
    fn write_le(self, out: &mut Vec<u8>);
    /// Reads one element from little-endian bytes (exactly `DTYPE.size_bytes()` long).
    fn read_le(b: &[u8]) -> Self;
}

macro_rules! element_num {
    ($t:ty, $dt:ident, $var:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$dt;
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn to_i64(self) -> i64 {
                self as i64
            }
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            fn wrap(v: Vec<Self>) -> Data {
                Data::$var(v)
            }
            fn unwrap(d: &Data) -> Option<&Vec<Self>> {
                if let Data::$var(v) = d { Some(v) } else { None }
            }
            fn unwrap_mut(d: &mut Data) -> Option<&mut Vec<Self>> {
                if let Data::$var(v) = d { Some(v) } else { None }
            }
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("element byte width"))
            }
        }
    };
}

element_num!(f32, F32, F32);
element_num!(f64, F64, F64);
element_num!(i8, I8, I8);
element_num!(u8, U8, U8);
element_num!(i32, I32, I32);
element_num!(i64, I64, I64);
element_num!(i16, I16, I16);
element_num!(u16, U16, U16);
element_num!(u32, U32, U32);
element_num!(u64, U64, U64);

macro_rules! element_half {
    ($t:ty, $dt:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$dt;
            fn to_f64(self) -> f64 {
                <$t>::to_f64(self)
            }
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
            fn to_i64(self) -> i64 {
                <$t>::to_f64(self) as i64
            }
            fn from_i64(v: i64) -> Self {
                <$t>::from_f64(v as f64)
            }
            fn wrap(v: Vec<Self>) -> Data {
                Data::$dt(v)
            }
            fn unwrap(d: &Data) -> Option<&Vec<Self>> {
                if let Data::$dt(v) = d { Some(v) } else { None }
            }
            fn unwrap_mut(d: &mut Data) -> Option<&mut Vec<Self>> {
                if let Data::$dt(v) = d { Some(v) } else { None }
            }
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("element byte width"))
            }
        }
    };
}

element_half!(f16, F16);
element_half!(bf16, BF16);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        if self { 1.0 } else { 0.0 }
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
    fn from_i64(v: i64) -> Self {
        v != 0
    }
    fn wrap(v: Vec<Self>) -> Data {
        Data::Bool(v)
    }
    fn unwrap(d: &Data) -> Option<&Vec<Self>> {
        if let Data::Bool(v) = d { Some(v) } else { None }
    }
    fn unwrap_mut(d: &mut Data) -> Option<&mut Vec<Self>> {
        if let Data::Bool(v) = d { Some(v) } else { None }
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
    fn read_le(b: &[u8]) -> Self {
        b[0] != 0
    }
}

impl Data {
    /// The dtype of this storage.
    pub fn dtype(&self) -> DType {
        fn dt<T: Element>(_: &[T]) -> DType {
            T::DTYPE
        }
        dispatch_data!(self, v => dt(v))
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        dispatch_data!(self, v => v.len())
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` zeros (false for bool) of `dtype`.
    pub fn zeros(dtype: DType, n: usize) -> Data {
        // `vec![0; n]` of a primitive asks the allocator for zeroed memory (fresh pages, untouched until written)
        // instead of writing every element.
        with_dtype!(dtype, T => T::wrap(vec![T::default(); n]))
    }

    /// Storage of `dtype` from f64 values, converted as `cast` does.
    pub fn from_f64_iter(dtype: DType, it: impl Iterator<Item = f64>) -> Data {
        fn go<T: Element>(it: impl Iterator<Item = f64>) -> Data {
            T::wrap(it.map(T::from_f64).collect())
        }
        with_dtype!(dtype, T => go::<T>(it))
    }

    /// Storage of `dtype` from i64 values (exact for integers).
    pub fn from_i64_iter(dtype: DType, it: impl Iterator<Item = i64>) -> Data {
        fn go<T: Element>(it: impl Iterator<Item = i64>) -> Data {
            T::wrap(it.map(T::from_i64).collect())
        }
        with_dtype!(dtype, T => go::<T>(it))
    }

    /// Element `i` as f64.
    pub fn get_f64(&self, i: usize) -> f64 {
        dispatch_data!(self, v => v[i].to_f64())
    }

    /// Element `i` as i64 (exact for integer types).
    pub fn get_i64(&self, i: usize) -> i64 {
        dispatch_data!(self, v => v[i].to_i64())
    }

    /// Gathers elements by index into new storage of the same dtype.
    pub fn gather(&self, idx: impl Iterator<Item = usize>) -> Data {
        fn go<T: Element>(v: &[T], idx: impl Iterator<Item = usize>) -> Data {
            T::wrap(idx.map(|i| v[i]).collect())
        }
        dispatch_data!(self, v => go(v, idx))
    }

    /// Little-endian bytes, row-major.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        fn go<T: Element>(v: &[T]) -> Vec<u8> {
            let mut out = Vec::with_capacity(v.len() * T::DTYPE.size_bytes());
            for &x in v {
                x.write_le(&mut out);
            }
            out
        }
        dispatch_data!(self, v => go(v))
    }

    /// Storage from little-endian bytes; `None` if the byte count is not a multiple of the element size.
    pub fn from_le_bytes(dtype: DType, bytes: &[u8]) -> Option<Data> {
        fn go<T: Element>(b: &[u8]) -> Data {
            T::wrap(b.chunks_exact(T::DTYPE.size_bytes()).map(T::read_le).collect())
        }
        if !bytes.len().is_multiple_of(dtype.size_bytes()) {
            return None;
        }
        Some(with_dtype!(dtype, T => go::<T>(bytes)))
    }
}

/// Runs `$body` with the type alias `$t` bound to the Rust element type of a runtime [`DType`].
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            $crate::types::DType::F32 => {
                type $t = f32;
                $body
            }
            $crate::types::DType::F16 => {
                type $t = half::f16;
                $body
            }
            $crate::types::DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            $crate::types::DType::F64 => {
                type $t = f64;
                $body
            }
            $crate::types::DType::I8 => {
                type $t = i8;
                $body
            }
            $crate::types::DType::U8 => {
                type $t = u8;
                $body
            }
            $crate::types::DType::I32 => {
                type $t = i32;
                $body
            }
            $crate::types::DType::I64 => {
                type $t = i64;
                $body
            }
            $crate::types::DType::Bool => {
                type $t = bool;
                $body
            }
            $crate::types::DType::I16 => {
                type $t = i16;
                $body
            }
            $crate::types::DType::U16 => {
                type $t = u16;
                $body
            }
            $crate::types::DType::U32 => {
                type $t = u32;
                $body
            }
            $crate::types::DType::U64 => {
                type $t = u64;
                $body
            }
            $crate::types::DType::F8E4M3FN => {
                type $t = $crate::narrow::F8E4M3FN;
                $body
            }
            $crate::types::DType::F8E4M3FNUZ => {
                type $t = $crate::narrow::F8E4M3FNUZ;
                $body
            }
            $crate::types::DType::F8E5M2 => {
                type $t = $crate::narrow::F8E5M2;
                $body
            }
            $crate::types::DType::F8E5M2FNUZ => {
                type $t = $crate::narrow::F8E5M2FNUZ;
                $body
            }
            $crate::types::DType::F8E8M0 => {
                type $t = $crate::narrow::F8E8M0;
                $body
            }
            $crate::types::DType::F4E2M1 => {
                type $t = $crate::narrow::F4E2M1;
                $body
            }
            $crate::types::DType::I4 => {
                type $t = $crate::narrow::I4;
                $body
            }
            $crate::types::DType::U4 => {
                type $t = $crate::narrow::U4;
                $body
            }
            $crate::types::DType::I2 => {
                type $t = $crate::narrow::I2;
                $body
            }
            $crate::types::DType::U2 => {
                type $t = $crate::narrow::U2;
                $body
            }
        }
    };
}
pub(crate) use with_dtype;

/// A concrete tensor: static shape plus row-major data.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Data,
}

/// Why a tensor could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tensor of shape {shape:?} needs {expected} elements, got {got}")]
pub struct ShapeDataMismatch {
    /// Requested shape.
    pub shape: Vec<usize>,
    /// Elements the shape needs.
    pub expected: usize,
    /// Elements supplied.
    pub got: usize,
}

impl Tensor {
    /// A tensor from shape and storage; the element count must match.
    pub fn new(shape: Vec<usize>, data: Data) -> Result<Tensor, ShapeDataMismatch> {
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(ShapeDataMismatch { shape, expected, got: data.len() });
        }
        Ok(Tensor { shape, data })
    }

    /// A tensor from a typed vector.
    pub fn from_vec<T: Element>(shape: Vec<usize>, v: Vec<T>) -> Result<Tensor, ShapeDataMismatch> {
        Tensor::new(shape, T::wrap(v))
    }

    /// A scalar.
    pub fn scalar<T: Element>(v: T) -> Tensor {
        Tensor { shape: Vec::new(), data: T::wrap(vec![v]) }
    }

    /// Zeros of the given dtype and shape.
    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Tensor {
        let n = shape.iter().product();
        Tensor { shape, data: Data::zeros(dtype, n) }
    }

    /// The bytes a tensor of `dtype` and `shape` needs, checked: `Err` when the count overflows or, for a large
    /// tensor (1 GiB and up), when this process cannot allocate it — said with the number of bytes, so sizes a
    /// user gives become errors instead of an allocation abort.
    pub fn allocatable_bytes(dtype: DType, shape: &[usize]) -> Result<usize, String> {
        let bytes = shape
            .iter()
            .try_fold(dtype.size_bytes(), |acc, &d| acc.checked_mul(d))
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| format!("a {dtype} tensor of shape {shape:?} has more than 2^63 bytes"))?;
        if bytes >= 1 << 30 {
            // A probe: the real allocation (zeroed pages) follows at once; small ones are not worth the call.
            Vec::<u8>::new().try_reserve_exact(bytes).map_err(|_| {
                format!("a {dtype} tensor of shape {shape:?} needs {bytes} bytes, which cannot be allocated")
            })?;
        }
        Ok(bytes)
    }

    /// [`Tensor::zeros`], with [`Tensor::allocatable_bytes`] checked first.
    pub fn try_zeros(dtype: DType, shape: Vec<usize>) -> Result<Tensor, String> {
        Tensor::allocatable_bytes(dtype, &shape)?;
        Ok(Tensor::zeros(dtype, shape))
    }

    /// [`Tensor::random`], with [`Tensor::allocatable_bytes`] checked first.
    pub fn try_random(dtype: DType, shape: Vec<usize>, seed: u64) -> Result<Tensor, String> {
        Tensor::allocatable_bytes(dtype, &shape)?;
        Ok(Tensor::random(dtype, shape, seed))
    }

    /// Deterministic pseudo-random values for `seed`: floats uniform in [-1, 1), integers in [0, 10), bools fair.
    pub fn random(dtype: DType, shape: Vec<usize>, seed: u64) -> Tensor {
        let n: usize = shape.iter().product();
        let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            // splitmix64: tiny, well distributed, and stable across platforms and versions.
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let data = if dtype.is_float() {
            Data::from_f64_iter(dtype, (0..n).map(|_| (next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0))
        } else if dtype == DType::Bool {
            Data::from_i64_iter(dtype, (0..n).map(|_| (next() >> 63) as i64))
        } else {
            Data::from_i64_iter(dtype, (0..n).map(|_| (next() % 10) as i64))
        };
        Tensor { shape, data }
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// The extents.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The storage.
    pub fn data(&self) -> &Data {
        &self.data
    }

    /// Consumes the tensor, returning shape and storage.
    pub fn into_parts(self) -> (Vec<usize>, Data) {
        (self.shape, self.data)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The elements as a typed slice, if the dtype is `T`.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        T::unwrap(&self.data).map(|v| v.as_slice())
    }

    /// The elements' bytes in memory (host byte order, which is little-endian on every supported target):
    /// what a compiled kernel reads. Every element type is plain data with no padding, `bool` a byte of 0 or 1.
    pub fn as_bytes(&self) -> &[u8] {
        fn go<T: Element>(v: &[T]) -> &[u8] {
            // SAFETY: every `Element` is a plain scalar type (f32, f64, f16, bf16, integers, bool) without
            // padding, so viewing its initialized storage as bytes is sound; the length covers exactly that
            // storage and the lifetime is tied to `v`.
            unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
        }
        dispatch_data!(&self.data, v => go(v))
    }

    /// A borrowed view of this tensor (what a run reads).
    pub fn view(&self) -> TensorView<'_> {
        TensorView { dtype: self.dtype(), shape: &self.shape, bytes: self.as_bytes() }
    }

    /// The elements' bytes, writable (host byte order), for compiled code to write a result in place.
    ///
    /// # Safety
    /// For a `bool` tensor, every byte written must be 0 or 1; any byte pattern is fine for the other dtypes.
    pub unsafe fn as_bytes_mut(&mut self) -> &mut [u8] {
        fn go<T: Element>(v: &mut [T]) -> &mut [u8] {
            // SAFETY: as in `as_bytes`, plus exclusivity from `&mut`; the caller keeps bool bytes valid.
            unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
        }
        dispatch_data!(&mut self.data, v => go(v))
    }

    /// A tensor of `dtype` and `shape` from its elements' bytes in host order (a copy); `None` when the byte
    /// count does not match.
    pub fn from_bytes(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Option<Tensor> {
        let n: usize = shape.iter().product();
        if bytes.len() != n * dtype.size_bytes() {
            return None;
        }
        fn copy<T: Element>(bytes: &[u8]) -> Data {
            let n = bytes.len() / std::mem::size_of::<T>();
            let mut v: Vec<T> = Vec::with_capacity(n);
            // SAFETY: `v` has room for `n` elements, exactly `bytes.len()` bytes, of a plain scalar type for which
            // every bit pattern is a valid value (bool is excluded by the caller); the regions are distinct
            // allocations; after the copy all `n` elements are initialized.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), bytes.len());
                v.set_len(n);
            }
            T::wrap(v)
        }
        // A bool byte other than 0 or 1 is not a valid `bool`: those go through the checked conversion.
        let data = if dtype == DType::Bool {
            Data::from_le_bytes(dtype, bytes)?
        } else {
            with_dtype!(dtype, T => copy::<T>(bytes))
        };
        Tensor::new(shape, data).ok()
    }

    /// The static [`TensorType`] of this tensor.
    pub fn tensor_type(&self) -> TensorType {
        TensorType::new(self.dtype(), Shape(self.shape.iter().map(|&d| (d as u64).into()).collect()))
    }

    /// Same data, new shape of the same element count.
    pub fn reshaped(self, shape: Vec<usize>) -> Result<Tensor, ShapeDataMismatch> {
        Tensor::new(shape, self.data)
    }

    /// Elements as f64 (lossless except for i64 beyond 2^53).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.len()).map(|i| self.data.get_f64(i)).collect()
    }

    /// Elements as i64 (floats truncate).
    pub fn to_i64_vec(&self) -> Vec<i64> {
        (0..self.len()).map(|i| self.data.get_i64(i)).collect()
    }

    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        strides_of(&self.shape)
    }
}

/// Row-major strides (in elements) of a static shape.
pub fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// One element in the JSON form of a tensor: numbers, booleans, or `"nan"`/`"inf"`/`"-inf"` for non-finite floats.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum JsonElem {
    Int(i64),
    UInt(u64),
    Float(f64),
    Bool(bool),
    Special(String),
}

#[derive(Serialize, Deserialize)]
struct TensorJson {
    dtype: DType,
    shape: Vec<usize>,
    values: Vec<JsonElem>,
}

impl Serialize for Tensor {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let dtype = self.dtype();
        let values = (0..self.len())
            .map(|i| match dtype {
                DType::Bool => JsonElem::Bool(self.data.get_i64(i) != 0),
                // `get_i64` is u64's bit pattern.
                DType::U64 => JsonElem::UInt(self.data.get_i64(i) as u64),
                d if d.is_int() => JsonElem::Int(self.data.get_i64(i)),
                _ => {
                    let v = self.data.get_f64(i);
                    if v.is_nan() {
                        JsonElem::Special("nan".into())
                    } else if v.is_infinite() {
                        JsonElem::Special(if v > 0.0 { "inf" } else { "-inf" }.into())
                    } else {
                        JsonElem::Float(v)
                    }
                }
            })
            .collect();
        TensorJson { dtype, shape: self.shape.clone(), values }.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Tensor {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Tensor, D::Error> {
        use serde::de::Error;
        let j = TensorJson::deserialize(d)?;
        let mut floats = Vec::with_capacity(j.values.len());
        let mut ints = Vec::with_capacity(j.values.len());
        for v in &j.values {
            let (f, i) = match v {
                JsonElem::Int(i) => (*i as f64, *i),
                JsonElem::UInt(u) => (*u as f64, *u as i64),
                JsonElem::Float(f) => (*f, *f as i64),
                JsonElem::Bool(b) => (*b as i64 as f64, *b as i64),
                JsonElem::Special(s) => match s.as_str() {
                    "nan" => (f64::NAN, 0),
                    "inf" => (f64::INFINITY, 0),
                    "-inf" => (f64::NEG_INFINITY, 0),
                    other => return Err(D::Error::custom(format!("bad tensor element {other:?}"))),
                },
            };
            floats.push(f);
            ints.push(i);
        }
        let data = if j.dtype.is_float() {
            Data::from_f64_iter(j.dtype, floats.into_iter())
        } else {
            Data::from_i64_iter(j.dtype, ints.into_iter())
        };
        Tensor::new(j.shape, data).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn views_check_length_alignment_and_bools() {
        let t = Tensor::from_vec(vec![2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
        let v = t.view();
        assert_eq!((v.dtype(), v.shape(), v.as_bytes().len()), (DType::F32, &[2usize, 2][..], 16));
        assert_eq!(v.to_tensor(), t);
        let bytes = t.as_bytes();
        let short = TensorView::new(DType::F32, &[2, 2], &bytes[..12]).unwrap_err();
        assert!(short.contains("has 16 bytes, got 12"), "{short}");
        let misaligned = TensorView::new(DType::F32, &[3], &bytes[1..13]).unwrap_err();
        assert!(misaligned.contains("not aligned"), "{misaligned}");
        assert!(TensorView::new(DType::Bool, &[2], &[1, 2]).unwrap_err().contains("0 or 1"));
        assert!(TensorView::new(DType::F32, &[usize::MAX, 2], &[]).unwrap_err().contains("2^64"));
        let empty = TensorView::new(DType::I64, &[0, 3], &[]).unwrap();
        assert_eq!(empty.to_tensor().shape(), &[0, 3]);
    }
    use super::*;

    #[test]
    fn bytes_round_trip_every_dtype() {
        for dt in DType::ALL {
            let t = Tensor::random(dt, vec![2, 3], 7);
            let bytes = t.data().to_le_bytes();
            assert_eq!(bytes.len(), 6 * dt.size_bytes());
            let back = Data::from_le_bytes(dt, &bytes).unwrap();
            assert_eq!(&back, t.data(), "{dt}");
        }
        assert!(Data::from_le_bytes(DType::F32, &[0, 1, 2]).is_none());
    }

    #[test]
    fn json_round_trip_keeps_non_finite() {
        let t = Tensor::from_vec(vec![3], vec![1.5f32, f32::NAN, f32::NEG_INFINITY]).unwrap();
        let s = serde_json::to_string(&t).unwrap();
        let back: Tensor = serde_json::from_str(&s).unwrap();
        assert_eq!(back.as_slice::<f32>().unwrap()[0], 1.5);
        assert!(back.as_slice::<f32>().unwrap()[1].is_nan());
        assert_eq!(back.as_slice::<f32>().unwrap()[2], f32::NEG_INFINITY);
    }

    #[test]
    fn shape_mismatch_is_an_error() {
        assert!(Tensor::from_vec(vec![2, 2], vec![1i32, 2, 3]).is_err());
        assert_eq!(strides_of(&[2, 3, 4]), vec![12, 4, 1]);
    }
}

/// A tensor borrowed from memory someone else owns (a NumPy array, a C caller's buffer): dtype, extents and the
/// row-major element bytes. Runs read their inputs through views, so a caller's buffer is bound without a copy.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    dtype: DType,
    shape: &'a [usize],
    bytes: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// A view of `bytes` as a `dtype` tensor of `shape`: the length must be exactly the elements' bytes, the
    /// address aligned for the dtype, and a `bool` tensor's bytes 0 or 1 (anything else is not a `bool`).
    pub fn new(dtype: DType, shape: &'a [usize], bytes: &'a [u8]) -> Result<TensorView<'a>, String> {
        let want = shape
            .iter()
            .try_fold(dtype.size_bytes(), |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| format!("a {dtype} tensor of shape {shape:?} has more than 2^64 bytes"))?;
        if bytes.len() != want {
            return Err(format!("a {dtype} tensor of shape {shape:?} has {want} bytes, got {}", bytes.len()));
        }
        if !bytes.is_empty() && !(bytes.as_ptr() as usize).is_multiple_of(dtype.size_bytes()) {
            return Err(format!("the data of a {dtype} tensor is not aligned to {} bytes", dtype.size_bytes()));
        }
        if dtype == DType::Bool && bytes.iter().any(|&b| b > 1) {
            return Err("a bool tensor holds a byte other than 0 or 1".into());
        }
        Ok(TensorView { dtype, shape, bytes })
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The extents.
    pub fn shape(&self) -> &'a [usize] {
        self.shape
    }

    /// The elements' bytes (host byte order).
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// An owned copy.
    pub fn to_tensor(&self) -> Tensor {
        // `new` checked the length and the bool bytes, which is all `from_bytes` can refuse.
        Tensor::from_bytes(self.dtype, self.shape.to_vec(), self.bytes).expect("a checked view converts")
    }
}
