//! `.npy` files ↔ [`Tensor`]s, through the `npyz` crate.
//!
//! Every kiln dtype round-trips: the numeric types and bool use numpy's own type strings; bf16, which numpy lacks,
//! is written as two raw bytes per element (`|V2`, what `ml_dtypes.bfloat16` arrays save as) and read back from
//! that. Fortran-order files are reordered to row-major on read. Anything else (structured arrays, strings,
//! complex numbers, unsigned types wider than a byte) is refused with the file's type string in the message.

use std::io::{self, BufWriter, Write};
use std::path::Path;

use half::{bf16, f16};
use kiln_ir::tensor::strides_of;
use kiln_ir::{DType, Data, Element, Tensor};
use npyz::{TypeChar, WriterBuilder};

/// Why an `.npy` file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    /// Reading or writing the file failed.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error (shown in the message, not chained: it is the whole story).
        error: io::Error,
    },
    /// The file holds a dtype kiln does not support.
    #[error("{path}: unsupported .npy dtype `{descr}` (kiln reads f32, f16, bf16 as |V2, f64, i8, u8, i32, i64, bool)")]
    Dtype {
        /// The file.
        path: String,
        /// numpy's type string.
        descr: String,
    },
}

/// Reads an `.npy` file.
pub fn read(path: &Path) -> Result<Tensor, NpyError> {
    let io_err = |error| NpyError::Io { path: path.display().to_string(), error };
    let bytes = kiln_ir::io::read_file(path).map_err(io_err)?;
    parse(path, &bytes)
}

/// Reads `.npy` bytes (read from `path`, which names them in errors).
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Tensor, NpyError> {
    from_bytes(bytes).map_err(|e| match e {
        FromBytes::Io(error) => NpyError::Io { path: path.display().to_string(), error },
        FromBytes::Dtype(descr) => NpyError::Dtype { path: path.display().to_string(), descr },
    })
}

/// The `.npy` bytes of `t` (what [`write`] writes).
pub fn to_bytes(t: &Tensor) -> Vec<u8> {
    let mut out = Vec::new();
    write_to(&mut out, t).expect("writing to memory cannot fail");
    out
}

enum FromBytes {
    Io(io::Error),
    Dtype(String),
}

/// The shape an `.npy` header declares, read before `npyz` parses it (`npyz` multiplies the extents without
/// checking, so a lying header would overflow there, and it evaluates arithmetic such as `9-3` in them): `None`
/// when the bytes have no `'shape': (…)` this can find (`npyz` then reports what is wrong), `Some(Err)` when the
/// tuple holds anything but plain integers.
fn declared_shape(bytes: &[u8]) -> Option<Result<Vec<u64>, String>> {
    let (len, rest) = declared_header(bytes)?;
    let header = std::str::from_utf8(rest.get(..len)?).ok()?;
    let after = &header[header.find("'shape'")? + "'shape'".len()..];
    let open = after.find('(')?;
    let close = open + after[open..].find(')')?;
    let inner = &after[open + 1..close];
    Some(
        inner
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(|d| d.parse::<u64>().map_err(|_| format!("the header's shape ({inner}) holds `{d}`, not an extent")))
            .collect(),
    )
}

/// The deepest bracket nesting a header may have (`{'descr': [('a', '<f4', (2,))], …}` is 4).
const MAX_HEADER_NESTING: usize = 8;

/// The header length an `.npy` prefix declares and the bytes after the length field; `None` when the bytes do not
/// start like an `.npy` file.
fn declared_header(bytes: &[u8]) -> Option<(usize, &[u8])> {
    let rest = bytes.strip_prefix(b"\x93NUMPY")?;
    let (major, rest) = rest.split_first()?;
    let rest = rest.get(1..)?;
    Some(match major {
        1 => (usize::from(u16::from_le_bytes(rest.get(..2)?.try_into().ok()?)), rest.get(2..)?),
        _ => (u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize, rest.get(4..)?),
    })
}

fn from_bytes(bytes: &[u8]) -> Result<Tensor, FromBytes> {
    // `npyz` allocates the header length the file declares before reading it: a length past the end of the file
    // is refused here (a 100-byte file claiming a 4 GiB header).
    if let Some((len, rest)) = declared_header(bytes) {
        if len > rest.len() {
            return Err(FromBytes::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the header declares {len} bytes, the file holds {} after it", rest.len()),
            )));
        }
        // `npyz` parses the header (a Python literal) with a backtracking parser whose time grows exponentially
        // with bracket nesting; real headers nest a few levels (a structured dtype's list of tuples), so deeper
        // ones are refused before parsing (found by `cargo fuzz run npy_read`: 90 `{` took minutes).
        let mut depth = 0usize;
        let mut deepest = 0usize;
        for &b in &rest[..len] {
            match b {
                b'{' | b'(' | b'[' => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                b'}' | b')' | b']' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        if deepest > MAX_HEADER_NESTING {
            return Err(FromBytes::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the header nests brackets {deepest} deep (an .npy header nests at most {MAX_HEADER_NESTING})"),
            )));
        }
    }
    // What the header declares must fit in the file before anything is sized from it: an element count that
    // overflows, or more bytes than the file holds (at one byte per element at least), is an error — never a
    // wrapped count or a huge allocation.
    if let Some(shape) = declared_shape(bytes) {
        let bad = |m: String| FromBytes::Io(io::Error::new(io::ErrorKind::InvalidData, m));
        let shape = shape.map_err(bad)?;
        // The non-zero extents must multiply without overflow even when another extent is 0 (strides are
        // products of extents too); the element count is 0 then.
        let nonzero = shape.iter().filter(|&&d| d != 0).try_fold(1u64, |n, &d| n.checked_mul(d));
        let count = nonzero.map(|n| if shape.contains(&0) { 0 } else { n });
        match count {
            None => return Err(bad(format!("the header's shape {shape:?} overflows an element count"))),
            Some(n) if n > bytes.len() as u64 => {
                return Err(bad(format!(
                    "the header's shape {shape:?} declares {n} elements, more than the file's {} bytes hold",
                    bytes.len()
                )));
            }
            Some(_) => {}
        }
    }
    let file = npyz::NpyFile::new(bytes).map_err(FromBytes::Io)?;
    let shape: Vec<usize> = file.shape().iter().map(|&d| d as usize).collect();
    let fortran = file.order() == npyz::Order::Fortran && shape.len() > 1;
    let descr = file.dtype().descr();
    let npyz::DType::Plain(ts) = file.dtype() else { return Err(FromBytes::Dtype(descr)) };
    let dtype = match (ts.type_char(), ts.size_field()) {
        (TypeChar::Float, 4) => DType::F32,
        (TypeChar::Float, 2) => DType::F16,
        (TypeChar::Float, 8) => DType::F64,
        (TypeChar::Int, 1) => DType::I8,
        (TypeChar::Uint, 1) => DType::U8,
        (TypeChar::Int, 2) => DType::I16,
        (TypeChar::Uint, 2) => DType::U16,
        (TypeChar::Uint, 4) => DType::U32,
        (TypeChar::Uint, 8) => DType::U64,
        (TypeChar::Int, 4) => DType::I32,
        (TypeChar::Int, 8) => DType::I64,
        (TypeChar::Bool, 1) => DType::Bool,
        (TypeChar::RawData, 2) => DType::BF16,
        _ => return Err(FromBytes::Dtype(descr)),
    };

    fn typed<T: Element + npyz::Deserialize>(f: npyz::NpyFile<&[u8]>) -> io::Result<Data> {
        f.into_vec::<T>().map(T::wrap)
    }
    let data = match dtype {
        DType::F32 => typed::<f32>(file),
        DType::F16 => typed::<f16>(file),
        DType::F64 => typed::<f64>(file),
        DType::I8 => typed::<i8>(file),
        DType::U8 => typed::<u8>(file),
        DType::I16 => typed::<i16>(file),
        DType::U16 => typed::<u16>(file),
        DType::U32 => typed::<u32>(file),
        DType::U64 => typed::<u64>(file),
        // No descriptor above reads as a narrow type.
        kiln_ir::narrow_dtypes!() => return Err(FromBytes::Dtype(descr)),
        DType::I32 => typed::<i32>(file),
        DType::I64 => typed::<i64>(file),
        DType::Bool => typed::<bool>(file),
        DType::BF16 => file.into_vec::<Vec<u8>>().map(|rows| {
            Data::BF16(rows.iter().map(|b| bf16::from_le_bytes([b[0], b.get(1).copied().unwrap_or(0)])).collect())
        }),
    }
    .map_err(FromBytes::Io)?;
    let n: usize = shape.iter().product();
    if data.len() != n {
        return Err(FromBytes::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("shape {shape:?} needs {n} elements, the file has {}", data.len()),
        )));
    }
    let data = if fortran { fortran_to_c(&data, &shape) } else { data };
    Tensor::new(shape, data).map_err(|e| FromBytes::Io(io::Error::new(io::ErrorKind::InvalidData, e.to_string())))
}

/// Reorders column-major storage to row-major.
fn fortran_to_c(data: &Data, shape: &[usize]) -> Data {
    let c_strides = strides_of(shape);
    let mut f_strides = vec![1usize; shape.len()];
    for k in 1..shape.len() {
        f_strides[k] = f_strides[k - 1] * shape[k - 1];
    }
    let n: usize = shape.iter().product();
    data.gather((0..n).map(|i| {
        let mut rem = i;
        let mut off = 0;
        for k in 0..shape.len() {
            off += rem / c_strides[k] * f_strides[k];
            rem %= c_strides[k];
        }
        off
    }))
}

/// Writes `t` as an `.npy` file (row-major, little-endian).
pub fn write(path: &Path, t: &Tensor) -> Result<(), NpyError> {
    let io_err = |error| NpyError::Io { path: path.display().to_string(), error };
    let file = std::fs::File::create(path).map_err(io_err)?;
    let mut w = BufWriter::new(file);
    write_to(&mut w, t).and_then(|_| w.flush()).map_err(io_err)
}

fn write_to<W: Write>(w: W, t: &Tensor) -> io::Result<()> {
    let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
    fn typed<T: Element + npyz::AutoSerialize, W: Write>(w: W, shape: &[u64], v: &[T]) -> io::Result<()> {
        let mut out = npyz::WriteOptions::new().default_dtype().shape(shape).writer(w).begin_nd()?;
        out.extend(v.iter().copied())?;
        out.finish()
    }
    match t.data() {
        Data::F32(v) => typed(w, &shape, v),
        Data::F16(v) => typed(w, &shape, v),
        Data::F64(v) => typed(w, &shape, v),
        Data::I8(v) => typed(w, &shape, v),
        Data::U8(v) => typed(w, &shape, v),
        Data::I16(v) => typed(w, &shape, v),
        Data::U16(v) => typed(w, &shape, v),
        Data::U32(v) => typed(w, &shape, v),
        Data::U64(v) => typed(w, &shape, v),
        Data::I32(v) => typed(w, &shape, v),
        Data::I64(v) => typed(w, &shape, v),
        Data::Bool(v) => typed(w, &shape, v),
        // NumPy has no bfloat16 or float8 of its own: raw void elements (`|V2`, `|V1`) that ml_dtypes' types
        // view; the sub-byte integers as their one-byte values.
        Data::BF16(_) => raw(w, &shape, "|V2", t),
        Data::F8E4M3FN(_)
        | Data::F8E4M3FNUZ(_)
        | Data::F8E5M2(_)
        | Data::F8E5M2FNUZ(_)
        | Data::F8E8M0(_)
        | Data::F4E2M1(_) => raw(w, &shape, "|V1", t),
        Data::I4(v) => typed(w, &shape, &v.iter().map(|x| x.0 as i8).collect::<Vec<_>>()),
        Data::I2(v) => typed(w, &shape, &v.iter().map(|x| x.0 as i8).collect::<Vec<_>>()),
        Data::U4(v) => typed(w, &shape, &v.iter().map(|x| x.0).collect::<Vec<_>>()),
        Data::U2(v) => typed(w, &shape, &v.iter().map(|x| x.0).collect::<Vec<_>>()),
    }
}

/// Writes `t`'s little-endian element bytes under the npy type `descr` (whose width is the dtype's size).
fn raw<W: Write>(w: W, shape: &[u64], descr: &str, t: &Tensor) -> io::Result<()> {
    let dtype = npyz::DType::Plain(descr.parse().expect("a valid type string"));
    let mut out = npyz::WriteOptions::<[u8]>::new().dtype(dtype).shape(shape).writer(w).begin_nd()?;
    for x in t.as_bytes().chunks_exact(t.dtype().size_bytes()) {
        out.push(x)?;
    }
    out.finish()
}

/// One entry of an output directory's `manifest.json`.
#[derive(serde::Serialize)]
struct OutputEntry<'a> {
    name: &'a str,
    file: String,
    dtype: &'static str,
    shape: &'a [usize],
}

/// `<name>.npy` with every character outside `[A-Za-z0-9_.-]` replaced by `_`.
pub fn output_file_name(name: &str) -> String {
    let clean: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') { c } else { '_' }).collect();
    format!("{clean}.npy")
}

/// Writes every output to `dir/<name>.npy` ([`output_file_name`]) and `dir/manifest.json`, a list of
/// `{"name", "file", "dtype", "shape"}` in output order (what `kiln run` writes). Two names that would share a
/// file are an error, before anything is written.
pub fn write_output_dir(dir: &Path, outputs: &[(String, Tensor)]) -> Result<(), NpyError> {
    fn io_err(path: &Path) -> impl Fn(io::Error) -> NpyError + '_ {
        move |error| NpyError::Io { path: path.display().to_string(), error }
    }
    let mut files: std::collections::BTreeMap<String, &str> = std::collections::BTreeMap::new();
    for (name, _) in outputs {
        let file = output_file_name(name);
        if let Some(other) = files.insert(file.clone(), name) {
            return Err(NpyError::Io {
                path: dir.join(&file).display().to_string(),
                error: io::Error::other(format!("outputs `{other}` and `{name}` would both be written here")),
            });
        }
    }
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let mut manifest = Vec::new();
    for (name, t) in outputs {
        let file = output_file_name(name);
        write(&dir.join(&file), t)?;
        manifest.push(OutputEntry { name, file, dtype: t.dtype().name(), shape: t.shape() });
    }
    let path = dir.join("manifest.json");
    let text =
        serde_json::to_string_pretty(&manifest).map_err(|e| io::Error::other(e.to_string())).map_err(io_err(&path))?;
    std::fs::write(&path, text + "\n").map_err(io_err(&path))
}

/// The `(name, file)` pairs a folder's `manifest.json` lists, files resolved against the folder: the list of
/// `{"name", "file", …}` objects [`write_output_dir`] writes (and the reference models' `inputs/` folders hold).
/// A missing or malformed manifest is an error naming it.
pub fn read_manifest(dir: &Path) -> Result<Vec<(String, std::path::PathBuf)>, NpyError> {
    #[derive(serde::Deserialize)]
    struct Entry {
        name: String,
        file: String,
    }
    let path = dir.join("manifest.json");
    let fail = |error: io::Error| NpyError::Io { path: path.display().to_string(), error };
    let text = kiln_ir::io::read_text(&path).map_err(fail)?;
    let entries: Vec<Entry> = serde_json::from_str(&text)
        .map_err(|e| fail(io::Error::other(format!("expected a list of {{\"name\": …, \"file\": …}} entries: {e}"))))?;
    Ok(entries.into_iter().map(|e| (e.name, dir.join(e.file))).collect())
}

/// A one-line look at a tensor: a few leading values and, for numbers, min/max/mean.
pub fn summary(t: &Tensor) -> String {
    if t.is_empty() {
        return "(empty)".into();
    }
    let v = t.to_f64_vec();
    let head: Vec<String> = v.iter().take(4).map(|x| format!("{x:.4}")).collect();
    let more = if v.len() > 4 { ", …" } else { "" };
    let (mut lo, mut hi, mut sum) = (f64::INFINITY, f64::NEG_INFINITY, 0.0);
    for &x in &v {
        lo = lo.min(x);
        hi = hi.max(x);
        sum += x;
    }
    format!("[{}{more}] min {lo:.4} max {hi:.4} mean {:.4}", head.join(", "), sum / v.len() as f64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn output_names_are_sanitized() {
        assert_eq!(super::output_file_name("logits"), "logits.npy");
        assert_eq!(super::output_file_name("present.0/key:0"), "present.0_key_0.npy");
        assert_eq!(super::output_file_name("a b-c_d"), "a_b-c_d.npy");
    }

    use super::*;

    #[test]
    fn every_dtype_round_trips() {
        for dt in DType::ALL {
            let t = Tensor::random(dt, vec![2, 3], 3);
            let mut buf = Vec::new();
            write_to(&mut buf, &t).unwrap();
            let back = from_bytes(&buf);
            if dt.is_narrow_float() {
                // Written as raw bytes (`|V1`), which name no type to read back as.
                assert!(back.is_err(), "{dt}");
            } else if dt.is_narrow() {
                // int4/int2 as their i8 values, uint4/uint2 as u8.
                let back = back.unwrap_or_else(|_| panic!("{dt} did not read back"));
                assert_eq!((back.to_i64_vec(), back.dtype().size_bytes()), (t.to_i64_vec(), 1), "{dt}");
            } else {
                let back = back.unwrap_or_else(|_| panic!("{dt} did not read back"));
                assert_eq!(back, t, "{dt}");
            }
        }
    }

    #[test]
    fn scalars_and_empty_tensors_round_trip() {
        for t in [Tensor::scalar(2.5f32), Tensor::zeros(DType::I64, vec![0, 4])] {
            let mut buf = Vec::new();
            write_to(&mut buf, &t).unwrap();
            assert_eq!(from_bytes(&buf).ok().unwrap(), t);
        }
    }

    #[test]
    fn fortran_order_is_reordered() {
        let data = Data::I32(vec![1, 4, 2, 5, 3, 6]); // [[1,2,3],[4,5,6]] stored column-major
        assert_eq!(fortran_to_c(&data, &[2, 3]), Data::I32(vec![1, 2, 3, 4, 5, 6]));
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(from_bytes(b"not an npy file").is_err());
        let t = Tensor::random(DType::F32, vec![4], 1);
        let mut buf = Vec::new();
        write_to(&mut buf, &t).unwrap();
        buf.truncate(buf.len() - 3);
        assert!(from_bytes(&buf).is_err());
    }

    /// A header whose shape overflows, or declares more data than the file holds, is refused before anything is
    /// sized from it (a 128-byte file claiming `(2**62, 4)` f32s used to wrap to a small count).
    #[test]
    fn headers_that_lie_about_their_size_are_errors() {
        let header = |shape: &str| {
            let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
            let mut text = dict.into_bytes();
            while !(10 + text.len() + 1).is_multiple_of(64) {
                text.push(b' ');
            }
            text.push(b'\n');
            let mut v = b"\x93NUMPY\x01\x00".to_vec();
            v.extend((text.len() as u16).to_le_bytes());
            v.extend(text);
            v.extend([0u8; 64]);
            v
        };
        let msg = |shape: &str| match from_bytes(&header(shape)) {
            Err(FromBytes::Io(e)) => e.to_string(),
            Err(FromBytes::Dtype(d)) => panic!("{shape}: dtype {d}"),
            Ok(t) => panic!("{shape}: read {:?}", t.shape()),
        };
        assert!(msg("(4611686018427387904, 4)").contains("overflows"), "{}", msg("(4611686018427387904, 4)"));
        assert!(msg("(1000000,)").contains("declares 1000000 elements"), "{}", msg("(1000000,)"));
        assert!(msg("(18446744073709551615, 18446744073709551615)").contains("overflows"));
        assert!(from_bytes(&header("(4,)")).is_ok(), "a header that fits reads");
        // Arithmetic in the shape, which `npyz` would evaluate (found by `cargo fuzz run npy_read`), and a zero
        // extent beside extents whose product overflows.
        assert!(
            msg("(5, 3775158741846003940-93, 0)").contains("not an extent"),
            "{}",
            msg("(5, 3775158741846003940-93, 0)")
        );
        assert!(msg("(5, 3775158741846003940, 0)").contains("overflows"), "{}", msg("(5, 3775158741846003940, 0)"));
        // A header of 90 nested `{` (found by `cargo fuzz run npy_read`: it took the parser minutes).
        let mut deep = b"\x93NUMPY\x01\x00\x76\x00".to_vec();
        deep.extend(std::iter::repeat_n(b'{', 90));
        deep.resize(8 + 0x76 + 2, b' ');
        match from_bytes(&deep) {
            Err(FromBytes::Io(e)) => assert!(e.to_string().contains("nests brackets 90 deep"), "{e}"),
            _ => panic!("a deeply nested header must be refused"),
        }
        // A version-3 prefix declaring a ~4 GiB header in a 113-byte file (found by `cargo fuzz run npy_read`).
        let mut lying = b"\x93NUMPY\x03\x00\x76\x00\x7b\xff".to_vec();
        lying.resize(113, 0xff);
        match from_bytes(&lying) {
            Err(FromBytes::Io(e)) => assert!(e.to_string().contains("the header declares"), "{e}"),
            _ => panic!("a header longer than the file must be refused"),
        }
    }
}
