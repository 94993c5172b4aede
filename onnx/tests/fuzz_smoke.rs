//! The fuzz targets' properties (`fuzz/src/lib.rs`, included here) on deterministic mutations, so every
//! `cargo test` exercises them without nightly or libFuzzer: 10,000 byte-level and 10,000 structure-aware mutations
//! of small ONNX models (any op swapped for any supported op, extreme attribute values, odd shapes), and 5,000
//! mutations of the `.kir` fixtures. A seed is fixed, so a failure reproduces; its input is saved under the test
//! target folder and the panic names the file. The seed corpus of `cargo fuzz` (`fuzz/seeds/`) is checked here too.
//! `KILN_FUZZ_SEEDS=write` rewrites `fuzz/seeds/onnx_import/` from the models built below; `KILN_FUZZ_SMOKE_SEED=N`
//! and `KILN_FUZZ_SMOKE_SCALE=K` pick another random stream and run K times as many iterations (see
//! `docs/fuzzing.md`); `KILN_FUZZ_SMOKE_TRACE=1` saves each input before trying it, for aborts and OOM kills.

mod model;
#[path = "../../fuzz/src/lib.rs"]
mod properties;
#[path = "../../fuzz/src/smoke_rng.rs"]
mod smoke_rng;

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

use model::*;
use onnx_protobuf::{Message, ModelProto};
use smoke_rng::Rng;

/// The seed of a run: fixed, unless `KILN_FUZZ_SMOKE_SEED` picks another stream (for hunting by hand).
fn rng(stream: u64) -> Rng {
    let extra: u64 = std::env::var("KILN_FUZZ_SMOKE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    Rng(stream ^ extra.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
}

/// `n` iterations, times `KILN_FUZZ_SMOKE_SCALE` when set.
fn iterations(n: usize) -> usize {
    n * std::env::var("KILN_FUZZ_SMOKE_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1)
}

/// Runs `property` on `input`; on a panic, saves the input and fails naming the file and iteration.
/// With `KILN_FUZZ_SMOKE_TRACE` set, each input is first written to `last-<what>.bin` in the failure folder, so an
/// abort or an out-of-memory kill (which no `catch_unwind` sees) leaves its input behind.
fn expect_no_panic(what: &str, iteration: usize, input: &[u8], property: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-smoke-failures");
    if std::env::var_os("KILN_FUZZ_SMOKE_TRACE").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("last-{what}.bin")), input).unwrap();
        std::fs::write(dir.join(format!("last-{what}.txt")), iteration.to_string()).unwrap();
    }
    if std::panic::catch_unwind(AssertUnwindSafe(|| property(input))).is_err() {
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("{what}-{iteration}.bin"));
        std::fs::write(&file, input).unwrap();
        panic!("{what}: iteration {iteration} broke the property; input saved to {}", file.display());
    }
}

/// Small valid models covering initializers, symbolic dims, shape arithmetic, subgraphs and attributes.
fn onnx_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let conv = ModelBuilder::new("conv")
        .input("x", dtype::FLOAT, &["1", "2", "5", "5"])
        .initializer(tensor_f32("w", &[3, 2, 3, 3], &[0.1; 54]))
        .node(with_attr(
            with_attr(node("conv", "Conv", &["x", "w"], &["c"]), attr_ints("pads", &[1, 1, 1, 1])),
            attr_ints("strides", &[2, 2]),
        ))
        .node(with_attr(
            with_attr(node("pool", "MaxPool", &["c"], &["p"]), attr_ints("kernel_shape", &[2, 2])),
            attr_ints("strides", &[1, 1]),
        ))
        .node(with_attr(node("sum", "ReduceSum", &["p"], &["y"]), attr_int("keepdims", 0)))
        .output("y");
    vec![
        ("relu", relu_model(&["batch", "3"]).bytes()),
        ("mlp", small_mlp().bytes()),
        ("flatten_chain", flatten_chain(&["batch", "3", "4"]).bytes()),
        ("flatten_chain_static", flatten_chain(&["2", "3", "4"]).bytes()),
        ("if", if_model(true).bytes()),
        ("conv_pool_reduce", conv.bytes()),
    ]
}

fn seed_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds").join(target)
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

#[test]
fn seed_corpus_imports() {
    let dir = seed_dir("onnx_import");
    if std::env::var("KILN_FUZZ_SEEDS").as_deref() == Ok("write") {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in onnx_seeds() {
            std::fs::write(dir.join(format!("{name}.onnx")), bytes).unwrap();
        }
    }
    let files = files_in(&dir);
    assert_eq!(files.len(), onnx_seeds().len(), "seed corpus {} is stale: rewrite it", dir.display());
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        kiln_onnx::import_bytes(&bytes, None, &Default::default()).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    }
    let kir = files_in(&seed_dir("kir_parse"));
    assert!(kir.len() >= 10, "expected the .kir seeds in fuzz/seeds/kir_parse");
    for f in kir {
        let text = std::fs::read_to_string(&f).unwrap();
        kiln_ir::parse(&text).unwrap_or_else(|e| panic!("{}:{e}", f.display()));
    }
}

/// One byte-level mutation: flip, overwrite, insert, delete, truncate, duplicate or splice.
fn mutate_bytes(rng: &mut Rng, mut b: Vec<u8>, other: &[u8]) -> Vec<u8> {
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(b.len() + 1);
        match rng.below(7) {
            0 if at < b.len() => b[at] ^= 1 << rng.below(8),
            1 if at < b.len() => {
                let random = rng.next() as u8;
                b[at] = *rng.pick(&[0x00, 0x01, 0x7f, 0x80, 0xff, random]);
            }
            2 => b.insert(at, rng.next() as u8),
            3 if at < b.len() => {
                b.remove(at);
            }
            4 => b.truncate(at),
            5 if at < b.len() => {
                let end = (at + 1 + rng.below(16)).min(b.len());
                let chunk = b[at..end].to_vec();
                b.splice(at..at, chunk);
            }
            _ => {
                let from = rng.below(other.len());
                let chunk = &other[from..(from + 1 + rng.below(32)).min(other.len())];
                b.splice(at..at, chunk.iter().copied());
            }
        }
    }
    b
}

#[test]
fn onnx_import_survives_byte_mutations() {
    let seeds: Vec<Vec<u8>> = onnx_seeds().into_iter().map(|(_, b)| b).collect();
    let mut rng = rng(0x5eed_0001);
    for i in 0..iterations(10_000) {
        let seed = rng.pick(&seeds).clone();
        let other = rng.pick(&seeds).clone();
        let input = mutate_bytes(&mut rng, seed, &other);
        expect_no_panic("onnx-bytes", i, &input, properties::onnx_import);
    }
}

/// One structure-aware mutation of a decoded model.
fn mutate_model(rng: &mut Rng, m: &mut ModelProto, ops: &[&str]) {
    let g = m.graph.as_mut().expect("seeds have graphs");
    match rng.below(8) {
        // Any node becomes any supported op, keeping its inputs, outputs and attributes.
        0 | 1 => {
            if !g.node.is_empty() {
                let i = rng.below(g.node.len());
                g.node[i].op_type = rng.pick(ops).to_string();
            }
        }
        // An attribute any handler might read, with a nasty value.
        2 => {
            if !g.node.is_empty() {
                let i = rng.below(g.node.len());
                let name = *rng.pick(&[
                    "axis",
                    "axes",
                    "keepdims",
                    "perm",
                    "pads",
                    "strides",
                    "kernel_shape",
                    "dilations",
                    "group",
                    "to",
                    "split",
                    "starts",
                    "ends",
                    "blocksize",
                    "upper",
                    "k",
                    "p",
                    "alpha",
                    "epsilon",
                    "num_outputs",
                ]);
                let a = if rng.below(2) == 0 {
                    attr_int(name, rng.nasty_int())
                } else {
                    let n = rng.below(6);
                    attr_ints(name, &(0..n).map(|_| rng.nasty_int()).collect::<Vec<_>>())
                };
                g.node[i].attribute.retain(|x| x.name != name);
                g.node[i].attribute.push(a);
            }
        }
        // An initializer's shape or a constant's dims changes.
        3 => {
            if !g.initializer.is_empty() {
                let i = rng.below(g.initializer.len());
                let dims = &mut g.initializer[i].dims;
                match rng.below(3) {
                    0 if !dims.is_empty() => {
                        let d = rng.below(dims.len());
                        dims[d] = rng.nasty_int();
                    }
                    1 => dims.push(rng.nasty_int().rem_euclid(4)),
                    _ => {
                        dims.pop();
                    }
                }
            }
        }
        // An input's dims change (static, symbolic, or missing).
        4 => {
            use onnx_protobuf::tensor_shape_proto::dimension::Value;
            if let Some(Some(onnx_protobuf::type_proto::Value::TensorType(tt))) =
                g.input.first_mut().map(|i| i.type_.as_mut().and_then(|t| t.value.as_mut()))
                && let Some(shape) = tt.shape.as_mut()
            {
                let mut dim = onnx_protobuf::tensor_shape_proto::Dimension::new();
                dim.value = match rng.below(3) {
                    0 => Some(Value::DimValue(rng.nasty_int().rem_euclid(9) - 1)),
                    1 => Some(Value::DimParam("n".into())),
                    _ => None,
                };
                if shape.dim.is_empty() || rng.below(2) == 0 {
                    shape.dim.push(dim);
                } else {
                    let d = rng.below(shape.dim.len());
                    shape.dim[d] = dim;
                }
            }
        }
        // Node inputs are rewired, dropped or duplicated.
        5 => {
            if !g.node.is_empty() {
                let i = rng.below(g.node.len());
                let names: Vec<String> = g
                    .node
                    .iter()
                    .flat_map(|n| n.output.clone())
                    .chain(g.input.iter().map(|v| v.name.clone()))
                    .collect();
                let n = &mut g.node[i];
                match rng.below(3) {
                    0 => n.input.push(rng.pick(&names).clone()),
                    1 => {
                        n.input.pop();
                    }
                    _ => n.input.push(String::new()),
                }
            }
        }
        // A constant node gets an integer tensor of nasty values, often a shape argument downstream.
        6 => {
            let values: Vec<i64> = (0..1 + rng.below(4)).map(|_| rng.nasty_int()).collect();
            let t = tensor_i64("", &[values.len() as i64], &values);
            let out = format!("k{}", rng.next() % 1000);
            let at = rng.below(g.node.len() + 1);
            g.node.insert(at, constant(&out, &out, t));
            let user = rng.below(g.node.len());
            if let Some(n) = g.node.get_mut(user)
                && !n.input.is_empty()
            {
                let slot = rng.below(n.input.len());
                n.input[slot] = out;
            }
        }
        // The opset moves.
        _ => m.opset_import[0].version = *rng.pick(&[1, 6, 7, 9, 11, 12, 13, 18, 21, 28, 29, i64::MAX]),
    }
}

#[test]
fn onnx_import_survives_structure_mutations() {
    let seeds: Vec<ModelProto> =
        onnx_seeds().into_iter().map(|(_, b)| ModelProto::parse_from_bytes(&b).unwrap()).collect();
    let names = kiln_onnx::supported_ops();
    let ops: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut rng = rng(0x5eed_0002);
    for i in 0..iterations(10_000) {
        let mut m = rng.pick(&seeds).clone();
        for _ in 0..1 + rng.below(3) {
            mutate_model(&mut rng, &mut m, &ops);
        }
        let input = m.write_to_bytes().unwrap();
        expect_no_panic("onnx-structure", i, &input, properties::onnx_import);
    }
}

#[test]
fn kir_parse_survives_mutations_and_prints_to_a_fixed_point() {
    let seeds: Vec<Vec<u8>> = files_in(&seed_dir("kir_parse")).iter().map(|f| std::fs::read(f).unwrap()).collect();
    for (i, s) in seeds.iter().enumerate() {
        expect_no_panic("kir-seed", i, s, properties::kir_parse);
    }
    let tokens: &[&[u8]] = &[
        b"%0",
        b"%9",
        b" : f32[2]",
        b"[batch,3]",
        b"{axis=-1}",
        b"\"",
        b"\n",
        b"}",
        b"1e309",
        b"-0",
        b"nan",
        b"i64[]",
    ];
    let mut rng = rng(0x5eed_0003);
    for i in 0..iterations(5_000) {
        let seed = rng.pick(&seeds).clone();
        let other = rng.pick(&seeds).clone();
        let mut input = mutate_bytes(&mut rng, seed, &other);
        if rng.below(2) == 0 {
            let at = rng.below(input.len() + 1);
            input.splice(at..at, rng.pick(tokens).iter().copied());
        }
        expect_no_panic("kir", i, &input, properties::kir_parse);
    }
}
