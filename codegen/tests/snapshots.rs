//! Snapshots of the printed kernel IR for representative groups, so that every change to lowering is reviewed.
//! Each case is also checked against the interpreter. Re-bless with `INSTA_UPDATE=always` (or `cargo insta`).

mod common;

use common::{check_kernel, whole_group};
use kiln_codegen::kernel;

/// (snapshot name, `.kir` text, symbol bindings for the numeric check).
type Case = (&'static str, &'static str, &'static [(&'static str, u64)]);

const CASES: &[Case] = &[
    (
        "elementwise_chain",
        r#"graph "g" {
          %0 = input {name="x"} : f32[batch,8]
          %1 = neg %0 : f32[batch,8]
          %2 = exp %1 : f32[batch,8]
          %3 = constant {value=f32[] [1.0]} : f32[]
          %4 = add %2, %3 : f32[batch,8]
          %5 = reciprocal %4 : f32[batch,8]
          %6 = mul %0, %5 : f32[batch,8]
          output "silu" = %6
        }"#,
        &[("batch", 3)],
    ),
    (
        "broadcast_add",
        r#"graph "g" {
          %0 = input {name="x"} : f32[4,1,3]
          %1 = input {name="bias"} : f32[5,3]
          %2 = add %0, %1 : f32[4,5,3]
          output "y" = %2
        }"#,
        &[],
    ),
    (
        "row_softmax",
        r#"graph "g" {
          %0 = input {name="logits"} : f32[batch,10]
          %1 = softmax %0 {axis=-1} : f32[batch,10]
          output "probs" = %1
        }"#,
        &[("batch", 2)],
    ),
    (
        "layer_norm",
        r#"graph "g" {
          %0 = input {name="x"} : f16[batch,seq,16]
          %1 = constant {value=f16[16] [1.0, 1.0, 0.5, 2.0, 1.0, 1.0, 0.5, 2.0, 1.0, 1.0, 0.5, 2.0, 1.0, 1.0, 0.5, 2.0]} : f16[16]
          %2 = input {name="bias"} : f16[16]
          %3 = layer_norm %0, %1, %2 {axis=-1, epsilon=1e-5} : f16[batch,seq,16]
          output "y" = %3
        }"#,
        &[("batch", 2), ("seq", 3)],
    ),
    (
        "transpose_add",
        r#"graph "g" {
          %0 = input {name="x"} : f32[3,4]
          %1 = transpose %0 {perm=[1, 0]} : f32[4,3]
          %2 = input {name="y"} : f32[4,3]
          %3 = add %1, %2 : f32[4,3]
          output "z" = %3
        }"#,
        &[],
    ),
    (
        "multi_output_row_stats",
        r#"graph "g" {
          %0 = input {name="x"} : f32[batch,6]
          %1 = exp %0 : f32[batch,6]
          %2 = reduce %1 {kind=sum, axes=[1], keep_dims=true} : f32[batch,1]
          %3 = div %1, %2 : f32[batch,6]
          %4 = arg_reduce %0 {kind=max, axis=1, keep_dims=false, select_last_index=false} : i64[batch]
          output "normalized" = %3
          output "sum" = %2
          output "argmax" = %4
        }"#,
        &[("batch", 4)],
    ),
];

#[test]
fn kernel_ir_snapshots() {
    for (name, text, bindings) in CASES {
        let g = kiln_ir::parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        // The fuse pass's contract: one shared iteration space.
        let k = kernel::lower(&g, &whole_group(&g), name).unwrap_or_else(|e| panic!("{name}: {e}"));
        check_kernel(name, &g, &k, bindings);
        insta::assert_snapshot!(*name, kernel::print(&k));
    }
}
