//! The runtime fuzz targets' properties (`fuzz/src/runtime_props.rs`, included here) on deterministic mutations,
//! so every `cargo test` exercises them without nightly or libFuzzer: `.npy` files of every dtype, an artifact
//! manifest (byte-level, and numbers in it replaced by hostile ones so the JSON still parses) and an exported
//! generation state, each mutated thousands of times from a fixed seed. A failure names the target and iteration.
//! `KILN_FUZZ_SMOKE_SCALE=K` runs K times as many iterations.

#[path = "../../fuzz/src/runtime_props.rs"]
mod properties;
#[path = "../../fuzz/src/smoke_rng.rs"]
mod smoke_rng;

use std::panic::AssertUnwindSafe;

use kiln_ir::{DType, Tensor};
use smoke_rng::Rng;

fn iterations(n: usize) -> usize {
    n * std::env::var("KILN_FUZZ_SMOKE_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1)
}

/// One byte-level mutation of `seed`: a flipped bit, an overwritten byte, an insertion, a deletion, a truncation
/// or a duplicated run.
fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(3) {
        let at = rng.below(v.len().max(1));
        match rng.below(6) {
            0 if !v.is_empty() => v[at] ^= 1 << rng.below(8),
            1 if !v.is_empty() => v[at] = [0, 0xff, b'9', b'-', b'(', b','][rng.below(6)],
            2 => v.insert(at.min(v.len()), rng.next() as u8),
            3 if !v.is_empty() => {
                v.remove(at);
            }
            4 => v.truncate(at),
            _ if !v.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(v.len());
                let run = v[at..end].to_vec();
                v.splice(at..at, run);
            }
            _ => {}
        }
    }
    v
}

/// Replaces one run of digits in `text` with a hostile number, so the JSON stays JSON and reaches the checks.
fn mutate_number(rng: &mut Rng, text: &str) -> Vec<u8> {
    let runs: Vec<(usize, usize)> = {
        let b = text.as_bytes();
        let mut runs = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i].is_ascii_digit() {
                let start = i;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
                runs.push((start, i));
            } else {
                i += 1;
            }
        }
        runs
    };
    let nasty = ["0", "1", "2", "7", "64", "4294967295", "18446744073709551615", "9223372036854775807", "99999"];
    let mut out = text.to_string();
    if let Some(&(a, b)) = runs.get(rng.below(runs.len())) {
        out.replace_range(a..b, nasty[rng.below(nasty.len())]);
    }
    out.into_bytes()
}

fn check(what: &str, iteration: usize, input: &[u8], property: fn(&[u8])) {
    if std::panic::catch_unwind(AssertUnwindSafe(|| property(input))).is_err() {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-smoke-failures");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("{what}-{iteration}.bin"));
        std::fs::write(&file, input).unwrap();
        panic!("{what}: iteration {iteration} broke the property; input saved to {}", file.display());
    }
}

#[test]
fn npy_reading_survives_mutations() {
    let seeds: Vec<Vec<u8>> = DType::ALL
        .into_iter()
        .enumerate()
        .map(|(i, d)| kiln_runtime::npy::to_bytes(&Tensor::random(d, vec![2, 3], i as u64)))
        .collect();
    for s in &seeds {
        properties::npy_read(s);
    }
    let mut rng = Rng(0x006e_7079);
    for i in 0..iterations(6000) {
        let pick = rng.below(seeds.len());
        let input = mutate(&mut rng, &seeds[pick]);
        check("npy_read", i, &input, properties::npy_read);
    }
}

/// A manifest of a small program with a library step (no kernels), as `kiln compile` writes one.
fn manifest_seed() -> String {
    use kiln_plan::artifact::*;
    let mut g = kiln_ir::parse(
        "graph \"m\" {\n  %0 = input {name=\"x\"} : f32[n,4]\n  %1 = param {name=\"w\"} : f32[4,3]\n  %2 = matmul %0, %1 : f32[n,3]\n  output \"y\" = %2\n}\n",
    )
    .unwrap();
    g.weights.insert("w", Tensor::random(DType::F32, vec![4, 3], 1));
    let executable = kiln_codegen::exec::build(&g).unwrap();
    let digest = |file: &str| FileDigest { file: file.into(), blake3: "00".repeat(32) };
    let port = |name: &str, shape: &str| PortInfo { name: name.into(), dtype: "f32".into(), shape: shape.into() };
    let m = ArtifactManifest::Cpu(CpuManifest {
        common: ManifestCommon {
            format_version: FORMAT_VERSION,
            kiln_version: "0.1.0".into(),
            inputs: vec![port("x", "[n,4]")],
            outputs: vec![port("y", "[n,3]")],
            weights: digest(WEIGHTS_FILE),
            code: digest(LIBRARY_FILE),
            executable,
            provenance: Default::default(),
            placement: vec![],
            digest: String::new(),
        },
        target: kiln_plan::cpu::CpuTarget { triple: kiln_plan::cpu::host_triple(), cpu_features: vec![] },
        kernels: vec![],
    });
    let mut m = m;
    seal(&mut m);
    serde_json::to_string_pretty(&m).unwrap()
}

#[test]
fn manifest_parsing_survives_mutations() {
    let seed = manifest_seed();
    properties::artifact_manifest(seed.as_bytes());
    kiln_plan::artifact::parse_manifest(std::path::Path::new("seed"), &seed).expect("the seed is a valid manifest");
    let mut rng = Rng(0x006d_616e);
    for i in 0..iterations(3000) {
        let input = if i % 2 == 0 { mutate_number(&mut rng, &seed) } else { mutate(&mut rng, seed.as_bytes()) };
        check("artifact_manifest", i, &input, properties::artifact_manifest);
    }
}

#[test]
fn state_decoding_survives_mutations() {
    let seeds = [properties::state_seed(1), properties::state_seed(4)];
    for s in &seeds {
        properties::state_decode(s);
        kiln_runtime::state::format::decode(s, &properties::state_spec(), properties::STATE_FINGERPRINT)
            .expect("the seed is a valid state");
    }
    let mut rng = Rng(0x7374_6174);
    for i in 0..iterations(6000) {
        let pick = rng.below(seeds.len());
        let input = mutate(&mut rng, &seeds[pick]);
        check("state_decode", i, &input, properties::state_decode);
    }
}

/// `KILN_FUZZ_SEEDS=write` writes the seeds above into `fuzz/seeds/<target>/` for `cargo fuzz`; otherwise the
/// checked-in seeds are checked to satisfy their properties.
#[test]
fn seed_corpora() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
    // A target, its seed files (name, bytes) and its property.
    type Seeds = (&'static str, Vec<(String, Vec<u8>)>, fn(&[u8]));
    let seeds: [Seeds; 3] = [
        (
            "npy_read",
            DType::ALL
                .into_iter()
                .enumerate()
                .map(|(i, d)| {
                    (format!("{d}.npy"), kiln_runtime::npy::to_bytes(&Tensor::random(d, vec![2, 3], i as u64)))
                })
                .collect(),
            properties::npy_read,
        ),
        (
            "artifact_manifest",
            vec![("matmul.json".into(), manifest_seed().into_bytes())],
            properties::artifact_manifest,
        ),
        (
            "state_decode",
            vec![("one.state".into(), properties::state_seed(1)), ("four.state".into(), properties::state_seed(4))],
            properties::state_decode,
        ),
    ];
    for (target, files, property) in seeds {
        let dir = root.join(target);
        if std::env::var("KILN_FUZZ_SEEDS").as_deref() == Ok("write") {
            std::fs::create_dir_all(&dir).unwrap();
            for (name, bytes) in &files {
                std::fs::write(dir.join(name), bytes).unwrap();
            }
        }
        let present: Vec<_> =
            std::fs::read_dir(&dir).map(|rd| rd.map(|e| e.unwrap().path()).collect()).unwrap_or_default();
        assert!(!present.is_empty(), "no seeds in {} (KILN_FUZZ_SEEDS=write makes them)", dir.display());
        for p in present {
            property(&std::fs::read(&p).unwrap());
        }
    }
}
