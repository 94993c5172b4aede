//! ONNX `TensorProto` → [`Tensor`]: typed data fields, `raw_data`, and external data files.
//!
//! External data paths are resolved against the model's folder and must stay inside it: a `location` that escapes
//! it (`../x`, an absolute path, a symlink out) is refused. Every size is checked against the declared shape
//! before any allocation that depends on it, so a lying header cannot exhaust memory.

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use kiln_ir::{DType, Data, Tensor};
use onnx_protobuf::TensorProto;

/// ONNX `TensorProto.DataType` codes → kiln dtypes; `Err` names the ONNX type kiln lacks.
pub fn dtype_from_onnx(code: i32) -> Result<DType, String> {
    Ok(match code {
        1 => DType::F32,
        2 => DType::U8,
        3 => DType::I8,
        6 => DType::I32,
        7 => DType::I64,
        9 => DType::Bool,
        10 => DType::F16,
        11 => DType::F64,
        16 => DType::BF16,
        4 => DType::U16,
        5 => DType::I16,
        12 => DType::U32,
        13 => DType::U64,
        17 => DType::F8E4M3FN,
        18 => DType::F8E4M3FNUZ,
        19 => DType::F8E5M2,
        20 => DType::F8E5M2FNUZ,
        21 => DType::U4,
        22 => DType::I4,
        23 => DType::F4E2M1,
        24 => DType::F8E8M0,
        25 => DType::U2,
        26 => DType::I2,
        other => return Err(format!("dtype {} is not supported", onnx_type_name(other))),
    })
}

/// The ONNX name of a `DataType` code, for messages.
pub fn onnx_type_name(code: i32) -> String {
    let names = [
        "undefined",
        "float",
        "uint8",
        "int8",
        "uint16",
        "int16",
        "int32",
        "int64",
        "string",
        "bool",
        "float16",
        "double",
        "uint32",
        "uint64",
        "complex64",
        "complex128",
        "bfloat16",
        "float8e4m3fn",
        "float8e4m3fnuz",
        "float8e5m2",
        "float8e5m2fnuz",
        "uint4",
        "int4",
        "float4e2m1",
        "float8e8m0",
        "uint2",
        "int2",
    ];
    usize::try_from(code).ok().and_then(|i| names.get(i)).map_or_else(|| format!("#{code}"), |n| n.to_string())
}

/// Decodes a tensor; `base_dir` is the model's folder, for external data (`None`: external data is refused).
pub fn tensor_from_proto(t: &TensorProto, base_dir: Option<&Path>) -> Result<Tensor, String> {
    let dtype = dtype_from_onnx(t.data_type)?;
    let mut shape = Vec::with_capacity(t.dims.len());
    let mut count: usize = 1;
    for &d in &t.dims {
        let d = usize::try_from(d).map_err(|_| format!("negative dimension {d}"))?;
        count = count.checked_mul(d).ok_or("element count overflows")?;
        shape.push(d);
    }
    // Serialized size: int4/uint4/float4 pack two elements per byte, int2/uint2 four.
    let bytes_needed = count.checked_mul(dtype.packed_bits() as usize).ok_or("byte size overflows")?.div_ceil(8);
    let external = t.data_location.value() == 1 || !t.external_data.is_empty();
    let data = if external {
        let bytes = read_external(t, base_dir, bytes_needed)?;
        from_serialized(dtype, &bytes, count).ok_or("external data has a ragged byte length")?
    } else if !t.raw_data.is_empty() || count == 0 && typed_len(t, dtype) == 0 {
        if t.raw_data.len() != bytes_needed {
            return Err(format!(
                "raw data holds {} bytes, but {} of {} need {bytes_needed}",
                t.raw_data.len(),
                fmt_shape(&shape),
                dtype
            ));
        }
        from_serialized(dtype, &t.raw_data, count).ok_or("raw data has a ragged byte length")?
    } else {
        let n = typed_len(t, dtype);
        if dtype.is_narrow() {
            // int32_data holds one serialized byte per entry (sub-byte types packed, as in raw data).
            if n != bytes_needed {
                return Err(format!("holds {n} entries, but {count} {dtype} elements need {bytes_needed}"));
            }
            let bytes: Vec<u8> = t.int32_data.iter().map(|&v| v as u8).collect();
            from_serialized(dtype, &bytes, count).ok_or("int32_data has a ragged length")?
        } else {
            if n != count {
                return Err(format!("holds {n} elements, but shape {} needs {count}", fmt_shape(&shape)));
            }
            typed_data(t, dtype)
        }
    };
    Tensor::new(shape, data).map_err(|e| e.to_string())
}

fn fmt_shape(s: &[usize]) -> String {
    format!("[{}]", s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(","))
}

/// Elements stored in the typed field that `dtype` uses.
fn typed_len(t: &TensorProto, dtype: DType) -> usize {
    match dtype {
        DType::F32 => t.float_data.len(),
        DType::F64 => t.double_data.len(),
        DType::I64 => t.int64_data.len(),
        DType::U32 | DType::U64 => t.uint64_data.len(),
        // int32_data carries every narrower type, f16/bf16 as their bit patterns.
        _ => t.int32_data.len(),
    }
}

/// `count` elements of `dtype` from their serialized little-endian bytes (sub-byte types unpacked to one element
/// per byte); `None` when the length does not fit.
fn from_serialized(dtype: DType, bytes: &[u8], count: usize) -> Option<Data> {
    let bits = dtype.packed_bits();
    if bits >= 8 {
        return Data::from_le_bytes(dtype, bytes);
    }
    if bytes.len() != kiln_ir::narrow::packed_len(count, bits) {
        return None;
    }
    let signed = matches!(dtype, DType::I4 | DType::I2);
    Data::from_le_bytes(dtype, &kiln_ir::narrow::unpack_sub_byte(bytes, count, bits, signed))
}

/// The typed field of a non-narrow dtype (narrow ones are read as serialized bytes).
fn typed_data(t: &TensorProto, dtype: DType) -> Data {
    match dtype {
        DType::F32 => Data::F32(t.float_data.clone()),
        DType::F64 => Data::F64(t.double_data.clone()),
        DType::I64 => Data::I64(t.int64_data.clone()),
        DType::I32 => Data::I32(t.int32_data.clone()),
        DType::I8 => Data::I8(t.int32_data.iter().map(|&v| v as i8).collect()),
        DType::U8 => Data::U8(t.int32_data.iter().map(|&v| v as u8).collect()),
        DType::Bool => Data::Bool(t.int32_data.iter().map(|&v| v != 0).collect()),
        DType::F16 => Data::F16(t.int32_data.iter().map(|&v| f16::from_bits(v as u16)).collect()),
        DType::BF16 => Data::BF16(t.int32_data.iter().map(|&v| bf16::from_bits(v as u16)).collect()),
        DType::I16 => Data::I16(t.int32_data.iter().map(|&v| v as i16).collect()),
        DType::U16 => Data::U16(t.int32_data.iter().map(|&v| v as u16).collect()),
        DType::U32 => Data::U32(t.uint64_data.iter().map(|&v| v as u32).collect()),
        DType::U64 => Data::U64(t.uint64_data.clone()),
        narrow => {
            let bytes: Vec<u8> = t.int32_data.iter().map(|&v| v as u8).collect();
            Data::from_le_bytes(narrow, &bytes).expect("one byte per element")
        }
    }
}

fn read_external(t: &TensorProto, base_dir: Option<&Path>, bytes_needed: usize) -> Result<Vec<u8>, String> {
    let base = base_dir.ok_or("external data needs the model's folder (load the model from a file)")?;
    let mut location = None;
    let mut offset = 0u64;
    let mut length = None;
    for kv in &t.external_data {
        match kv.key.as_str() {
            "location" => location = Some(kv.value.clone()),
            "offset" => offset = kv.value.parse().map_err(|_| format!("bad external data offset `{}`", kv.value))?,
            "length" => {
                length = Some(kv.value.parse::<u64>().map_err(|_| format!("bad external data length `{}`", kv.value))?)
            }
            "checksum" => {}
            other => return Err(format!("unknown external data key `{other}`")),
        }
    }
    let location = location.ok_or("external data without a location")?;
    let path = contained_path(base, &location)?;
    if let Some(len) = length
        && len != bytes_needed as u64
    {
        return Err(format!("external data length {len} disagrees with the {bytes_needed} bytes the shape needs"));
    }
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(&path).map_err(|e| format!("external data {}: {e}", path.display()))?;
    let size = f.metadata().map_err(|e| e.to_string())?.len();
    if offset.checked_add(bytes_needed as u64).is_none_or(|end| end > size) {
        return Err(format!(
            "external data {} is {size} bytes; offset {offset} + {bytes_needed} runs past its end",
            path.display()
        ));
    }
    f.seek(SeekFrom::Start(offset)).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; bytes_needed];
    f.read_exact(&mut buf).map_err(|e| format!("external data {}: {e}", path.display()))?;
    Ok(buf)
}

/// `base/location`, refusing anything that resolves outside `base`.
pub fn contained_path(base: &Path, location: &str) -> Result<PathBuf, String> {
    let rel = Path::new(location);
    let escapes = rel.is_absolute()
        || rel.components().any(|c| matches!(c, std::path::Component::ParentDir | std::path::Component::Prefix(_)));
    let refuse = || format!("external data location `{location}` is outside the model's folder; refused");
    if escapes {
        return Err(refuse());
    }
    let joined = base.join(rel);
    let (Ok(base_c), Ok(joined_c)) = (base.canonicalize(), joined.canonicalize()) else {
        return Err(format!("external data file `{location}` does not exist beside the model"));
    };
    if !joined_c.starts_with(&base_c) {
        return Err(refuse());
    }
    Ok(joined_c)
}

/// Why a tensor file could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TensorFileError {
    /// A well-formed tensor of a dtype kiln does not support.
    #[error("{0}")]
    Unsupported(String),
    /// The file is unreadable, not a `TensorProto`, or inconsistent (sizes, external data).
    #[error("{0}")]
    Invalid(String),
}

/// Reads a serialized `TensorProto` file (ONNX test data's `input_N.pb`/`output_N.pb`): its name and value.
pub fn read_tensor_file(path: &Path) -> Result<(String, Tensor), TensorFileError> {
    use protobuf::Message;
    let invalid = |e: String| TensorFileError::Invalid(format!("{}: {e}", path.display()));
    let bytes = kiln_ir::io::read_file(path).map_err(|e| invalid(e.to_string()))?;
    let proto = TensorProto::parse_from_bytes(&bytes).map_err(|e| invalid(format!("not a TensorProto: {e}")))?;
    if let Err(e) = dtype_from_onnx(proto.data_type) {
        return Err(TensorFileError::Unsupported(format!("{}: {e}", path.display())));
    }
    let t = tensor_from_proto(&proto, path.parent()).map_err(invalid)?;
    Ok((proto.name.clone(), t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proto(dtype: i32, dims: &[i64]) -> TensorProto {
        let mut t = TensorProto::new();
        t.data_type = dtype;
        t.dims = dims.to_vec();
        t
    }

    #[test]
    fn sub_byte_types_unpack_to_one_element_per_byte() {
        // INT4 [-8, 7, -1] packed low nibble first: 0x78, 0x0F; a short buffer is an error, not a read past it.
        let mut t = proto(22, &[3]);
        t.raw_data = vec![0x78, 0x0F];
        let x = tensor_from_proto(&t, None).unwrap();
        assert_eq!((x.dtype(), x.to_i64_vec()), (DType::I4, vec![-8, 7, -1]));
        t.raw_data = vec![0x78];
        assert!(tensor_from_proto(&t, None).unwrap_err().contains("raw data holds 1 bytes"));
        // UINT2 [1, 2, 3, 0, 3] in int32_data, four per byte.
        let mut t = proto(25, &[5]);
        t.int32_data = vec![0b00_11_10_01, 0b11];
        assert_eq!(tensor_from_proto(&t, None).unwrap().to_i64_vec(), vec![1, 2, 3, 0, 3]);
        // FLOAT8E4M3FN bytes: 1.0 is 0x38, -448 is 0xFE.
        let mut t = proto(17, &[2]);
        t.raw_data = vec![0x38, 0xFE];
        assert_eq!(tensor_from_proto(&t, None).unwrap().to_f64_vec(), vec![1.0, -448.0]);
    }

    #[test]
    fn raw_and_typed_data_decode() {
        let mut t = proto(1, &[2]);
        t.raw_data = [1.5f32.to_le_bytes(), (-2.0f32).to_le_bytes()].concat();
        assert_eq!(tensor_from_proto(&t, None).unwrap().as_slice::<f32>().unwrap(), &[1.5, -2.0]);
        let mut t = proto(7, &[3]);
        t.int64_data = vec![1, -2, 3];
        assert_eq!(tensor_from_proto(&t, None).unwrap().to_i64_vec(), vec![1, -2, 3]);
        let mut t = proto(10, &[1]);
        t.int32_data = vec![f16::from_f32(0.5).to_bits() as i32];
        assert_eq!(tensor_from_proto(&t, None).unwrap().to_f64_vec(), vec![0.5]);
    }

    #[test]
    fn size_disagreements_are_errors() {
        let mut t = proto(1, &[4]);
        t.raw_data = vec![0; 12];
        assert!(tensor_from_proto(&t, None).unwrap_err().contains("need 16"));
        let mut t = proto(7, &[2, 2]);
        t.int64_data = vec![1];
        assert!(tensor_from_proto(&t, None).is_err());
        assert!(tensor_from_proto(&proto(1, &[-1]), None).is_err());
        assert!(tensor_from_proto(&proto(1, &[i64::MAX, i64::MAX]), None).is_err());
        assert!(tensor_from_proto(&proto(8, &[1]), None).unwrap_err().contains("string"));
    }

    #[test]
    fn escaping_locations_are_refused() {
        let dir = std::env::temp_dir();
        assert!(contained_path(&dir, "../etc/passwd").unwrap_err().contains("outside"));
        assert!(contained_path(&dir, "/etc/passwd").unwrap_err().contains("outside"));
    }
}
