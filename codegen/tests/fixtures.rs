//! Every fixture graph in `tests/fixtures/*.kir` that holds only lowerable ops and no parameters lowers as one
//! group and matches the interpreter; every other fixture is refused with an error naming its first
//! non-lowerable node, never a panic.

mod common;

use common::{check_kernel, lower_whole};
use kiln_codegen::kernel::LowerError;

/// Symbol values for the fixtures that have symbolic inputs.
const BINDINGS: &[(&str, u64)] = &[("batch", 3), ("seq", 2)];

#[test]
fn lowerable_fixtures_match_the_interpreter() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let mut paths: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    paths.retain(|p| p.extension().is_some_and(|e| e == "kir"));
    paths.sort();
    let (mut lowered, mut refused) = (Vec::new(), Vec::new());
    for path in paths {
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let g = kiln_ir::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
        if g.params().next().is_some() {
            refused.push(name);
            continue;
        }
        match lower_whole(&g, &name) {
            Ok(k) => {
                check_kernel(&name, &g, &k, BINDINGS);
                lowered.push(name);
            }
            Err(LowerError::Unsupported { .. }) => refused.push(name),
            Err(e) => panic!("{name}: {e}"),
        }
    }
    assert_eq!(
        lowered,
        [
            "elementwise_broadcast",
            "float_literals",
            "integer_ops",
            "iota_shape_of",
            "names_and_comments",
            "reductions",
            "select_compare_cast",
            "softmax_layer_norm",
            "whole_tensor_reductions",
        ]
    );
    assert_eq!(
        refused,
        [
            "control_flow",
            "conv3x3_layers",
            "conv_pool",
            "conv_symbolic",
            "data_dependent",
            "fusion",
            "lstm_gru",
            "mlp_params",
            "mlp_symbolic_batch",
            "multi_result",
            "params_only",
            "resize",
            "shape_ops",
            "top_k"
        ]
    );
}
