//! Differential testing: random graphs (`kiln::difftest`) compiled for the CPU with one and two threads must match
//! the interpreter (floats within rtol 1e-4, atol 1e-5 plus four times how far the element moves when the
//! interpreter's intermediate results are perturbed by two ulps — the allowance ill-conditioned arithmetic needs;
//! NaN matching NaN; integers exactly; an interpreter error must be a CPU error too). Every failing seed is reported with its graph's `.kir` text.
//!
//! For hunting by hand: `KILN_DIFFTEST_SEEDS=START..END` runs another range (the default is `SEEDS`); `KILN_DIFFTEST_SKIP=softmax,matmul` leaves those op kinds out (names as in
//! `kiln::difftest::OpKind`, lowercase), which changes every graph.

use std::ops::Range;

use kiln::difftest::GenOptions;

/// The seeds every `cargo test` runs.
const SEEDS: Range<u64> = 0..300;

/// Seeds the fuzz campaigns found failing, each fixed and kept here (run with the default generator options).
const REGRESSIONS: &[(u64, &str)] = &[
    (
        534_597_089_841,
        "a whole-tensor mean read by a scalar statement after another parallel nest of the same fused kernel: the \
         reader's part re-declared the accumulator (read its identity, 0)",
    ),
    (
        16_685_253_023_763_199,
        "a layer norm over 8 equal elements: its output is rounding noise amplified 316× (1/sqrt(epsilon)), which \
         differs between summation orders — the comparison allows for each element's measured rounding spread",
    ),
];

#[test]
fn seeds_the_fuzz_campaigns_found_stay_fixed() {
    for (seed, what) in REGRESSIONS {
        if let Err(e) = kiln::difftest::check_with(*seed, &GenOptions::default()) {
            panic!("seed {seed} ({what}) fails again:\n{e}");
        }
    }
}

/// The seeds to run.
fn seeds() -> Range<u64> {
    let Ok(text) = std::env::var("KILN_DIFFTEST_SEEDS") else { return SEEDS };
    let (a, b) = text.split_once("..").expect("KILN_DIFFTEST_SEEDS is START..END");
    a.trim().parse().expect("a seed")..b.trim().parse().expect("a seed")
}

fn options() -> GenOptions {
    let mut options = GenOptions::default();
    if let Ok(skip) = std::env::var("KILN_DIFFTEST_SKIP") {
        let skip: Vec<String> = skip.split(',').map(|s| s.trim().replace('_', "").to_lowercase()).collect();
        options.ops.retain(|k| !skip.contains(&format!("{k:?}").to_lowercase()));
    }
    options
}

#[test]
fn random_graphs_match_the_interpreter() {
    let start = std::time::Instant::now();
    let range = seeds();
    let options = options();
    let mut failures = Vec::new();
    for seed in range.clone() {
        if let Err(e) = kiln::difftest::check_with(seed, &options) {
            eprintln!("{e}\n");
            failures.push(seed);
        }
    }
    eprintln!("{} seeds in {:.1?}", range.end - range.start, start.elapsed());
    assert!(failures.is_empty(), "{} failing seeds (reported above): {failures:?}", failures.len());
}

/// The generator covers what it promises, and every graph it builds verifies (no backend runs, so this is quick).
#[test]
fn the_generator_covers_every_op_kind_and_builds_valid_graphs() {
    let options = GenOptions::default();
    let mut text = String::new();
    let (mut zero_size, mut several_outputs, mut weights) = (0, 0, 0);
    for seed in 0..1000 {
        let (g, _) = kiln::difftest::random_graph(seed, &options);
        kiln_ir::verify(&g).unwrap_or_else(|e| panic!("seed {seed}: the generator built an invalid graph: {e:?}"));
        let printed = kiln_ir::print(&g);
        zero_size += usize::from(printed.contains("[0") || printed.contains(",0"));
        several_outputs += usize::from(g.outputs().len() > 1);
        weights += usize::from(!g.weights.is_empty());
        text.push_str(&printed);
    }
    for op in [
        "relu",
        "exp",
        "tanh",
        "sigmoid",
        "neg",
        "abs",
        "sqrt",
        "erf",
        "log",
        "add",
        "sub",
        "mul",
        "div",
        "max",
        "min",
        "reduce",
        "softmax",
        "layer_norm",
        "matmul",
        "reshape",
        "transpose",
        "broadcast",
        "slice",
        "concat",
        "cast",
        "gelu",
        "param",
    ] {
        assert!(text.contains(&format!("= {op} ")), "no `{op}` in 1,000 graphs");
    }
    for (what, n) in [("zero-size shapes", zero_size), ("several outputs", several_outputs), ("weights", weights)] {
        assert!(n >= 20, "only {n} of 1,000 graphs have {what}");
    }
}
