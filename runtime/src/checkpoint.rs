//! Checkpoints: safetensors files, memory-mapped, handing out [`CheckpointLease`]s of single tensors.
//!
//! [`Checkpoint::open`] maps the file and validates its whole header before anything is leased — with the
//! `safetensors` crate (the header length fits the file, the header is JSON, every dtype and shape is well formed,
//! the entries' byte ranges are contiguous, match their shapes' byte counts and cover the data section), plus
//! kiln's own rule that every entry starts at a multiple of its element size relative to the file (so a
//! page-aligned mapping gives aligned elements). A truncated or corrupt file is a [`RunError::Checkpoint`] naming the path and the tensor; a file
//! that opened is never read out of bounds later.
//!
//! A lease holds an `Arc` of the mapping, so the bytes stay mapped as long as any lease lives, even after the
//! [`Checkpoint`] itself is dropped. Leasing copies nothing. Tensors of dtypes kiln lacks (`F4`, `C64`, …) are
//! listed and range-checked but cannot be leased: that is an error naming the tensor and its dtype.
//!
//! [`CheckpointSource`] is what parameter materialization reads from: a mapped [`Checkpoint`], or a
//! [`MemoryCheckpoint`] built from tensors (for tests and for weights that never touched a file).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use kiln_ir::{DType, Tensor};

use crate::RunError;

/// The bytes a lease points into.
enum Storage {
    /// A read-only mapping of a checkpoint file.
    Mapped(memmap2::Mmap),
    /// Bytes in memory (an empty file, which cannot be mapped, or a [`MemoryCheckpoint`] tensor).
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A tensor's dtype and shape, as a checkpoint declares them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The element type.
    pub dtype: DType,
    /// The extents.
    pub shape: Vec<usize>,
}

impl TensorInfo {
    /// Elements (the product of the extents).
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// One validated header entry.
#[derive(Clone, Debug)]
struct Entry {
    /// `Err(safetensors dtype name)` for dtypes kiln does not have.
    dtype: Result<DType, String>,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    range: Range<usize>,
}

/// One tensor of a checkpoint, borrowed without copying: its bytes stay valid while the lease lives.
#[derive(Clone)]
pub struct CheckpointLease {
    storage: Arc<Storage>,
    range: Range<usize>,
    name: String,
    origin: Arc<str>,
    info: TensorInfo,
}

impl CheckpointLease {
    /// A lease over a copy of `tensor`'s bytes, named `name`, from a source called `origin` (for messages).
    pub fn from_tensor(origin: &str, name: &str, tensor: &Tensor) -> CheckpointLease {
        let bytes = tensor.as_bytes().to_vec();
        let range = 0..bytes.len();
        CheckpointLease {
            storage: Arc::new(Storage::Owned(bytes)),
            range,
            name: name.to_string(),
            origin: origin.into(),
            info: TensorInfo { dtype: tensor.dtype(), shape: tensor.shape().to_vec() },
        }
    }

    /// The tensor's name in its checkpoint.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where it came from (the checkpoint's path), for messages.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Its dtype and shape.
    pub fn info(&self) -> &TensorInfo {
        &self.info
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.info.dtype
    }

    /// The extents.
    pub fn shape(&self) -> &[usize] {
        &self.info.shape
    }

    /// The raw little-endian element bytes, exactly `elements × dtype size` of them.
    pub fn bytes(&self) -> &[u8] {
        &self.storage.bytes()[self.range.clone()]
    }

    /// The first byte's address, to check that two leases (or a lease and a weight) share storage.
    pub fn as_ptr(&self) -> *const u8 {
        self.bytes().as_ptr()
    }

    /// A copy of the bytes as a tensor. A `bool` byte other than 0 or 1 is an error naming the tensor.
    pub fn to_tensor(&self) -> Result<Tensor, RunError> {
        let bytes = self.bytes();
        if self.info.dtype == DType::Bool
            && let Some(i) = bytes.iter().position(|&b| b > 1)
        {
            return Err(
                self.error(format!("bytes are not valid values of its dtype (bool element {i} is {})", bytes[i]))
            );
        }
        Tensor::from_bytes(self.info.dtype, self.info.shape.clone(), bytes)
            .ok_or_else(|| self.error("bytes are not valid values of its dtype"))
    }

    /// A [`RunError::Checkpoint`] about this tensor.
    pub fn error(&self, message: impl std::fmt::Display) -> RunError {
        RunError::Checkpoint { path: self.origin.to_string(), message: format!("tensor `{}`: {message}", self.name) }
    }
}

impl std::fmt::Debug for CheckpointLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointLease")
            .field("origin", &self.origin)
            .field("name", &self.name)
            .field("dtype", &self.info.dtype)
            .field("shape", &self.info.shape)
            .finish()
    }
}

/// Where parameter materialization finds tensors by name.
pub trait CheckpointSource: Send + Sync {
    /// A name for messages (a path).
    fn origin(&self) -> &str;

    /// Every tensor name, sorted.
    fn names(&self) -> Vec<String>;

    /// A tensor's dtype and shape without leasing it; `Err` when it is absent or of a dtype kiln lacks.
    fn info(&self, name: &str) -> Result<TensorInfo, RunError>;

    /// A lease of one tensor; `Err` when it is absent or of a dtype kiln lacks.
    fn lease(&self, name: &str) -> Result<CheckpointLease, RunError>;

    /// Whether a tensor of this name exists (of any dtype).
    fn contains(&self, name: &str) -> bool {
        self.names().binary_search_by(|n| n.as_str().cmp(name)).is_ok()
    }
}

/// A memory-mapped safetensors checkpoint with a validated header. See the module docs.
pub struct Checkpoint {
    origin: Arc<str>,
    storage: Arc<Storage>,
    entries: BTreeMap<String, Entry>,
    metadata: BTreeMap<String, String>,
}

impl Checkpoint {
    /// Maps `path` and validates its header (see the module docs).
    pub fn open(path: &Path) -> Result<Checkpoint, RunError> {
        let origin: Arc<str> = path.display().to_string().into();
        let fail = |message: String| RunError::Checkpoint { path: origin.to_string(), message };
        let file = std::fs::File::open(path).map_err(|e| fail(format!("cannot open: {e}")))?;
        let len = file.metadata().map_err(|e| fail(format!("cannot stat: {e}")))?.len();
        let storage = if len == 0 {
            Storage::Owned(Vec::new())
        } else {
            // SAFETY: the mapping is read-only and private to this process; kiln never writes the file while a
            // checkpoint is open. Another process truncating or rewriting it meanwhile is outside what any
            // reader of a mapped file can defend against (documented in docs/parameters.md).
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| fail(format!("cannot map: {e}")))?;
            Storage::Mapped(map)
        };
        Checkpoint::from_storage(origin, storage)
    }

    /// A checkpoint over safetensors bytes held in memory (validated as [`Checkpoint::open`] does).
    pub fn from_bytes(origin: &str, bytes: Vec<u8>) -> Result<Checkpoint, RunError> {
        Checkpoint::from_storage(origin.into(), Storage::Owned(bytes))
    }

    fn from_storage(origin: Arc<str>, storage: Storage) -> Result<Checkpoint, RunError> {
        let (entries, metadata) =
            validate(storage.bytes()).map_err(|message| RunError::Checkpoint { path: origin.to_string(), message })?;
        Ok(Checkpoint { origin, storage: Arc::new(storage), entries, metadata })
    }

    /// The `__metadata__` strings of the header.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// Tensors in the checkpoint.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn entry(&self, name: &str) -> Result<(&Entry, DType), RunError> {
        let fail = |message: String| RunError::Checkpoint { path: self.origin.to_string(), message };
        let e = self.entries.get(name).ok_or_else(|| fail(format!("has no tensor `{name}`")))?;
        match &e.dtype {
            Ok(d) => Ok((e, *d)),
            Err(other) => Err(fail(format!("tensor `{name}` has dtype {other}, which kiln does not support"))),
        }
    }
}

impl CheckpointSource for Checkpoint {
    fn origin(&self) -> &str {
        &self.origin
    }

    fn names(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    fn info(&self, name: &str) -> Result<TensorInfo, RunError> {
        let (e, dtype) = self.entry(name)?;
        Ok(TensorInfo { dtype, shape: e.shape.clone() })
    }

    fn lease(&self, name: &str) -> Result<CheckpointLease, RunError> {
        let (e, dtype) = self.entry(name)?;
        Ok(CheckpointLease {
            storage: Arc::clone(&self.storage),
            range: e.range.clone(),
            name: name.to_string(),
            origin: Arc::clone(&self.origin),
            info: TensorInfo { dtype, shape: e.shape.clone() },
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }
}

/// Validates a safetensors image with the `safetensors` crate (header length and size limit, JSON, every entry's
/// dtype, shape and offsets: contiguous, in bounds, matching the shape's byte count, covering the data section),
/// then what kiln adds: every element aligned to its size relative to the file, so a page-aligned mapping gives
/// aligned elements. Entries are by absolute byte range.
#[allow(clippy::type_complexity)]
fn validate(bytes: &[u8]) -> Result<(BTreeMap<String, Entry>, BTreeMap<String, String>), String> {
    let (header_len, meta) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| match e {
        safetensors::SafeTensorError::HeaderTooSmall => {
            format!("truncated: {} bytes, too short for the 8-byte header length", bytes.len())
        }
        safetensors::SafeTensorError::InvalidHeaderLength => {
            format!("truncated: the header length does not fit the file's {} bytes", bytes.len())
        }
        safetensors::SafeTensorError::MetadataIncompleteBuffer => {
            "the tensors' byte ranges do not cover the data section exactly: the file is truncated or corrupt".into()
        }
        e => format!("not a valid safetensors file: {e}"),
    })?;
    let data_start = 8 + header_len;
    let mut entries = BTreeMap::new();
    for (name, info) in meta.tensors() {
        let (begin, end) = info.data_offsets;
        let elem = info.dtype.bitsize().div_ceil(8).max(1);
        if !(data_start + begin).is_multiple_of(elem) {
            return Err(format!(
                "tensor `{name}`: its data starts at file offset {}, not a multiple of its {elem}-byte elements \
                 (unaligned)",
                data_start + begin
            ));
        }
        let dtype = crate::weights::kiln_dtype(info.dtype).ok_or_else(|| info.dtype.to_string());
        entries.insert(name, Entry { dtype, shape: info.shape.clone(), range: data_start + begin..data_start + end });
    }
    let metadata = meta.metadata().clone().unwrap_or_default().into_iter().collect();
    Ok((entries, metadata))
}

/// A checkpoint held in memory: tensors by name. Each lease copies nothing beyond the one copy made when the
/// tensor was inserted.
#[derive(Default)]
pub struct MemoryCheckpoint {
    origin: String,
    tensors: BTreeMap<String, CheckpointLease>,
}

impl MemoryCheckpoint {
    /// An empty checkpoint called `origin` in messages.
    pub fn new(origin: impl Into<String>) -> MemoryCheckpoint {
        MemoryCheckpoint { origin: origin.into(), tensors: BTreeMap::new() }
    }

    /// Adds (or replaces) a tensor.
    pub fn insert(&mut self, name: impl Into<String>, tensor: &Tensor) {
        let name = name.into();
        let lease = CheckpointLease::from_tensor(&self.origin, &name, tensor);
        self.tensors.insert(name, lease);
    }

    /// Builder form of [`MemoryCheckpoint::insert`].
    pub fn with(mut self, name: impl Into<String>, tensor: &Tensor) -> MemoryCheckpoint {
        self.insert(name, tensor);
        self
    }
}

impl CheckpointSource for MemoryCheckpoint {
    fn origin(&self) -> &str {
        &self.origin
    }

    fn names(&self) -> Vec<String> {
        self.tensors.keys().cloned().collect()
    }

    fn info(&self, name: &str) -> Result<TensorInfo, RunError> {
        self.lease(name).map(|l| l.info().clone())
    }

    fn lease(&self, name: &str) -> Result<CheckpointLease, RunError> {
        self.tensors.get(name).cloned().ok_or_else(|| RunError::Checkpoint {
            path: self.origin.clone(),
            message: format!("has no tensor `{name}`"),
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors image from (name, dtype, shape, offsets) entries and a data section, with the header padded
    /// to a multiple of 8 bytes as safetensors writes it.
    fn image(entries: &[(&str, &str, &[usize], [usize; 2])], data: &[u8]) -> Vec<u8> {
        let mut header = serde_json::Map::new();
        for (name, dtype, shape, offsets) in entries {
            header.insert(
                name.to_string(),
                serde_json::json!({ "dtype": dtype, "shape": shape, "data_offsets": offsets }),
            );
        }
        let mut text = serde_json::Value::Object(header).to_string().into_bytes();
        while !text.len().is_multiple_of(8) {
            text.push(b' ');
        }
        let mut out = (text.len() as u64).to_le_bytes().to_vec();
        out.extend(text);
        out.extend_from_slice(data);
        out
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn message(r: Result<Checkpoint, RunError>, case: &str) -> String {
        match r {
            Err(RunError::Checkpoint { path, message }) => format!("{path}: {message}"),
            Err(e) => panic!("{case}: wrong error kind: {e}"),
            Ok(_) => panic!("{case}: a bad checkpoint opened"),
        }
    }

    #[test]
    fn opens_maps_and_leases_without_copying() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ck.safetensors");
        let mut data = f32_bytes(&[1.0, -2.0, 3.5, f32::NAN]);
        data.extend(7i64.to_le_bytes());
        let img = image(&[("a", "F32", &[2, 2], [0, 16]), ("b", "I64", &[1], [16, 24])], &data);
        std::fs::write(&path, img).unwrap();
        let ck = Checkpoint::open(&path).unwrap();
        assert_eq!(ck.names(), vec!["a".to_string(), "b".to_string()]);
        assert_eq!(ck.info("a").unwrap(), TensorInfo { dtype: DType::F32, shape: vec![2, 2] });
        let a = ck.lease("a").unwrap();
        let again = ck.lease("a").unwrap();
        assert_eq!(a.as_ptr(), again.as_ptr(), "two leases of one tensor share the mapped bytes");
        drop(ck);
        // The lease keeps the mapping alive after the checkpoint is gone.
        assert_eq!(a.bytes(), &data[..16]);
        assert_eq!(a.to_tensor().unwrap().as_slice::<f32>().unwrap()[..3], [1.0, -2.0, 3.5]);
    }

    #[test]
    fn files_written_by_the_safetensors_crate_open() {
        let (w, ids) = (f32_bytes(&[0.25, -0.0, 1.0, 2.0, 3.0, 4.0]), 5i64.to_le_bytes());
        let views = [
            ("w", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 3], &w).unwrap()),
            ("ids", safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![1], &ids).unwrap()),
        ];
        let metadata = Some(std::collections::HashMap::from([("format".to_string(), "pt".to_string())]));
        let bytes = safetensors::serialize(views, metadata).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("st.safetensors");
        std::fs::write(&path, bytes).unwrap();
        let ck = Checkpoint::open(&path).unwrap();
        assert_eq!(ck.metadata().get("format").map(String::as_str), Some("pt"));
        assert_eq!(ck.lease("w").unwrap().shape(), &[2, 3]);
        assert_eq!(ck.lease("w").unwrap().bytes(), &w[..]);
        assert_eq!(ck.lease("ids").unwrap().to_tensor().unwrap().as_slice::<i64>().unwrap(), &[5]);
    }

    #[test]
    fn truncated_and_corrupt_files_are_errors_naming_path_and_tensor() {
        let data = f32_bytes(&[1.0; 4]);
        let good = image(&[("w", "F32", &[4], [0, 16])], &data);
        // A 57-byte header puts the data at file offset 65: well formed for safetensors, unaligned for f32.
        let unaligned = {
            let text = br#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
            let mut v = (text.len() as u64 + 2).to_le_bytes().to_vec();
            v.extend_from_slice(text);
            v.extend_from_slice(b"  ");
            v.extend_from_slice(&data);
            v
        };
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("empty", vec![], "too short"),
            ("short length", vec![1, 2, 3], "too short"),
            ("header past the end", good[..20].to_vec(), "truncated"),
            ("data cut off", good[..good.len() - 3].to_vec(), "do not cover the data section"),
            ("data too long", [good.clone(), vec![0; 4]].concat(), "do not cover the data section"),
            ("huge header", u64::MAX.to_le_bytes().to_vec(), "header too large"),
            (
                "not json",
                {
                    let mut v = 4u64.to_le_bytes().to_vec();
                    v.extend(b"{{{{");
                    v
                },
                "invalid JSON in header",
            ),
            (
                "not an object",
                {
                    let mut v = 2u64.to_le_bytes().to_vec();
                    v.extend(b"[]");
                    v
                },
                "invalid JSON in header",
            ),
            ("wrong size", image(&[("w", "F32", &[3], [0, 16])], &data), "invalid shape, data type, or offset"),
            ("reversed", image(&[("w", "F32", &[0], [16, 0])], &data), "invalid offset for tensor `w`"),
            ("unknown dtype", image(&[("w", "Q4", &[4], [0, 16])], &data), "invalid JSON in header"),
            ("bad shape", image(&[("w", "F32", &[], [0, 16])], &data), "invalid shape, data type, or offset"),
            (
                "overlap",
                image(&[("w", "F32", &[2], [0, 8]), ("v", "F32", &[2], [4, 12])], &data),
                "invalid offset for tensor",
            ),
            ("unaligned", unaligned, "tensor `w`: its data starts at file offset 65"),
        ];
        let dir = tempfile::tempdir().unwrap();
        for (case, bytes, want) in cases {
            let path = dir.path().join(format!("{}.safetensors", case.replace(' ', "_")));
            std::fs::write(&path, &bytes).unwrap();
            let msg = message(Checkpoint::open(&path), case);
            assert!(msg.starts_with(&path.display().to_string()), "{case}: {msg}");
            assert!(msg.contains(want), "{case}: `{msg}` lacks `{want}`");
        }
        assert!(message(Checkpoint::open(&dir.path().join("absent")), "absent").contains("cannot open"));
    }

    #[test]
    fn unsupported_dtypes_are_listed_but_not_leased() {
        let img = image(&[("w", "F32", &[1], [0, 4]), ("q", "F4", &[8], [4, 8])], &[0; 8]);
        let ck = Checkpoint::from_bytes("mem", img).unwrap();
        assert!(ck.contains("q"));
        let err = ck.lease("q").unwrap_err().to_string();
        assert!(err.contains("tensor `q` has dtype F4, which kiln does not support"), "{err}");
        assert!(ck.lease("missing").unwrap_err().to_string().contains("has no tensor `missing`"));
    }

    #[test]
    fn invalid_bool_bytes_are_an_error() {
        let img = image(&[("b", "BOOL", &[2], [0, 2])], &[1, 7]);
        let ck = Checkpoint::from_bytes("mem", img).unwrap();
        let err = ck.lease("b").unwrap().to_tensor().unwrap_err().to_string();
        assert!(err.contains("tensor `b`: bytes are not valid values"), "{err}");
    }

    #[test]
    fn memory_checkpoints_lease_their_tensors() {
        let t = Tensor::from_vec(vec![3], vec![1i64, 2, 3]).unwrap();
        let ck = MemoryCheckpoint::new("test").with("ids", &t);
        assert_eq!(ck.lease("ids").unwrap().to_tensor().unwrap(), t);
        assert_eq!(ck.lease("ids").unwrap().as_ptr(), ck.lease("ids").unwrap().as_ptr());
        assert!(ck.info("other").is_err());
    }
}
