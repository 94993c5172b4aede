//! 3×3 convolutions with stride 1 by Winograd's minimal filtering, F(2×2, 3×3): each 2×2 block of output takes
//! 16 multiplies per input channel instead of 36, so the products cost 2.25× fewer multiply-adds.
//!
//! The weights are transformed once, when a program loads ([`WinogradWeights::transform`]: `U = G g Gᵀ`, 16
//! matrices `[M, C]`). Each call transforms the input's 4×4 tiles (`V = Bᵀ d B`, 16 matrices `[C, tiles]`),
//! multiplies the 16 pairs with the GEMM library (`M = U V`), and transforms back (`Y = Aᵀ M A`, the bias
//! added). F(2×2, 3×3)'s transforms use only additions and halvings, so its rounding is that of a direct
//! convolution's summation in another order; the larger tiles of F(4×4, 3×3) would save more multiplies but lose
//! about a decimal digit, which the reference tolerances do not allow.

use kiln_ir::op::Conv;
use rayon::prelude::*;

use super::matmul::gemm_rowmajor_raw;
use super::{LibraryError, Par, check_len, with_scratch};

const OP: &str = "conv";

/// Tile side of the input transform (output tile 2 + kernel 3 - 1).
const TILE: usize = 4;
/// Transformed elements per tile.
const POINTS: usize = TILE * TILE;

/// A 3×3 conv's weights in the Winograd domain: `POINTS` matrices `[M, C]`, row-major, one after another.
#[derive(Clone, Debug, PartialEq)]
pub struct WinogradWeights {
    m: usize,
    c: usize,
    u: Vec<f32>,
}

impl WinogradWeights {
    /// Transforms conv weights `w` of shape `[M, C, 3, 3]`.
    pub fn transform(w: &[f32], w_shape: &[usize]) -> Result<WinogradWeights, LibraryError> {
        let &[m, c, 3, 3] = w_shape else {
            return Err(LibraryError::shape(OP, format!("Winograd needs weights [M, C, 3, 3], got {w_shape:?}")));
        };
        check_len(OP, "w", w.len(), w_shape)?;
        let mut u = vec![0f32; POINTS * m * c];
        for (mc, g) in w.chunks_exact(9).enumerate() {
            // t = G g (4×3), then U = t Gᵀ (4×4); G's rows are (1,0,0), (½,½,½), (½,-½,½), (0,0,1).
            let mut t = [[0f32; 3]; 4];
            for j in 0..3 {
                let (g0, g1, g2) = (g[j], g[3 + j], g[6 + j]);
                t[0][j] = g0;
                t[1][j] = 0.5 * (g0 + g1 + g2);
                t[2][j] = 0.5 * (g0 - g1 + g2);
                t[3][j] = g2;
            }
            for (i, row) in t.iter().enumerate() {
                let values = [row[0], 0.5 * (row[0] + row[1] + row[2]), 0.5 * (row[0] - row[1] + row[2]), row[2]];
                for (l, v) in values.into_iter().enumerate() {
                    u[(i * TILE + l) * m * c + mc] = v;
                }
            }
        }
        Ok(WinogradWeights { m, c, u })
    }

    /// Output channels.
    pub fn out_channels(&self) -> usize {
        self.m
    }

    /// Input channels.
    pub fn in_channels(&self) -> usize {
        self.c
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.u.len() * 4
    }
}

/// Whether [`conv_winograd_f32`] computes this conv: 2-D, a 3×3 kernel, stride 1, dilation 1, one group.
pub fn winograd_applies(w_shape: &[usize], attrs: &Conv) -> bool {
    w_shape.len() == 4
        && w_shape[2..] == [3, 3]
        && attrs.groups == 1
        && attrs.strides.iter().all(|&s| s == 1)
        && attrs.dilations.iter().all(|&d| d == 1)
        && attrs.pads.len() == 4
        && attrs.pads.iter().all(|&p| (0..=2).contains(&p))
}

/// Fewest output positions per image for a 3×3 stride-1 conv to run by Winograd F(2×2, 3×3): 13×13 and up, 49
/// tiles or more. ResNet-18's 7×7 layers (16 tiles) win in isolation (`cargo bench -p kiln-runtime --bench
/// conv3x3`: 1.9×) but lose inside the model, where their transformed 512-channel weights (16 MiB each) stream
/// from memory for 16 tiles of products; at 13×13 and 14×14 (49 tiles) Winograd wins in the bench (1.08–1.6× on
/// one thread) and in the models (resnet18 1.5–2 ms faster with its 14×14 layers included, A/B alternated).
const MIN_OUTPUT: u64 = 13 * 13;

/// Whether Winograd beats im2col + GEMM for a 3×3 stride-1 conv from `c` to `m` channels with `output_positions`
/// output positions per image. The transforms cost per tile in proportion to `c + m` and the products save in
/// proportion to `c·m`, so a narrow conv loses: `cargo bench -p kiln-runtime --bench conv3x3` has Winograd at
/// 0.53–0.55× of im2col for 3 input channels (a stem), 0.77–0.97× for 16 → 16, about even for 8 → 8 and for
/// 16 → 32 on one thread (0.59–0.73× on two), and winning from 24 → 24 (1.08–1.24×) and 16 → 64 (1.23–2.29×)
/// up; the rule is `c·m / (c + m) ≥ 12`.
pub fn winograd_pays(c: usize, m: usize, output_positions: u64) -> bool {
    let (c, m) = (c as u128, m as u128);
    output_positions >= MIN_OUTPUT && c * m >= 12 * (c + m)
}

/// A 2-D 3×3 stride-1 conv (`x` `[N, C, H, W]`, weights transformed by [`WinogradWeights::transform`], optional
/// bias `[M]`, `y` `[N, M, OH, OW]`), with the same meaning as [`super::conv_f32`].
pub fn conv_winograd_f32(
    x: &[f32],
    x_shape: &[usize],
    wt: &WinogradWeights,
    bias: Option<&[f32]>,
    attrs: &Conv,
    y: &mut [f32],
    y_shape: &[usize],
    par: Par,
) -> Result<(), LibraryError> {
    let &[n, c, h, w] = x_shape else {
        return Err(LibraryError::shape(OP, format!("Winograd needs x [N, C, H, W], got {x_shape:?}")));
    };
    if !winograd_applies(&[wt.m, wt.c, 3, 3], attrs) {
        return Err(LibraryError::Unsupported { op: OP, what: "Winograd for these attributes".into() });
    }
    let (pt, pl, pb, pr) =
        (attrs.pads[0] as usize, attrs.pads[1] as usize, attrs.pads[2] as usize, attrs.pads[3] as usize);
    let (oh, ow) = ((h + pt + pb).saturating_sub(2), (w + pl + pr).saturating_sub(2));
    if c != wt.c || y_shape != [n, wt.m, oh, ow] {
        return Err(LibraryError::shape(
            OP,
            format!(
                "x {x_shape:?} and weights [{}, {}, 3, 3] give y [{n}, {}, {oh}, {ow}], not {y_shape:?}",
                wt.m, wt.c, wt.m
            ),
        ));
    }
    check_len(OP, "x", x.len(), x_shape)?;
    check_len(OP, "y", y.len(), y_shape)?;
    if let Some(b) = bias
        && b.len() != wt.m
    {
        return Err(LibraryError::shape(OP, format!("bias has {} elements for {} channels", b.len(), wt.m)));
    }
    if y.is_empty() {
        return Ok(());
    }
    let geometry = Tiles { c, h, w, pt, pl, oh, ow, th: oh.div_ceil(2), tw: ow.div_ceil(2) };
    for (xi, yi) in x.chunks_exact(c * h * w).zip(y.chunks_exact_mut(wt.m * oh * ow)) {
        image(&geometry, xi, wt, bias, yi, par);
    }
    Ok(())
}

/// One image's tiling.
struct Tiles {
    c: usize,
    h: usize,
    w: usize,
    pt: usize,
    pl: usize,
    oh: usize,
    ow: usize,
    /// Tile rows and columns.
    th: usize,
    tw: usize,
}

impl Tiles {
    fn count(&self) -> usize {
        self.th * self.tw
    }
}

fn image(g: &Tiles, x: &[f32], wt: &WinogradWeights, bias: Option<&[f32]>, y: &mut [f32], par: Par) {
    let (c, m, t) = (g.c, wt.m, g.count());
    with_scratch(c * POINTS * t + m * POINTS * t, |scratch| {
        let (v, prod) = scratch.split_at_mut(c * POINTS * t);
        transform_and_multiply(g, x, wt, bias, y, par, v, prod);
    });
}

/// [`image`]'s work on scratch buffers: `v` and `prod` are fully written before they are read.
#[allow(clippy::too_many_arguments)]
fn transform_and_multiply(
    g: &Tiles,
    x: &[f32],
    wt: &WinogradWeights,
    bias: Option<&[f32]>,
    y: &mut [f32],
    par: Par,
    v: &mut [f32],
    prod: &mut [f32],
) {
    let (c, m, t) = (g.c, wt.m, g.count());
    let parallel = par.threads > 1;
    // V, by channel: [c][e][tile], so a channel's transform writes one contiguous block and product `e` reads
    // rows `e` of every channel block (row stride POINTS·t).
    let transform = |ci: usize, block: &mut [f32]| input_transform(g, &x[ci * g.h * g.w..][..g.h * g.w], block);
    if parallel {
        v.par_chunks_mut(POINTS * t).enumerate().for_each(|(ci, block)| transform(ci, block));
    } else {
        v.chunks_mut(POINTS * t).enumerate().for_each(|(ci, block)| transform(ci, block));
    }
    // The 16 products M[e] = U[e] · V[e], written as [mi][e][tile] so each output channel's transform reads one
    // contiguous block: product `e` fills rows `e` of every channel block (row stride POINTS·t).
    let prod_len = prod.len();
    let shared = SharedProducts(prod.as_mut_ptr());
    let multiply = |e: usize| {
        let shared = &shared;
        // SAFETY: product `e` writes only rows `e` of each `[e][tile]` block, which no other product writes; the
        // buffer outlives the products.
        unsafe {
            gemm_rowmajor_raw(
                m,
                t,
                c,
                &wt.u[e * m * c..][..m * c],
                c,
                &v[e * t..],
                POINTS * t,
                shared.0.add(e * t),
                prod_len - e * t,
                POINTS * t,
                false,
                Par::SERIAL,
            )
        }
    };
    if parallel {
        (0..POINTS).into_par_iter().for_each(multiply);
    } else {
        (0..POINTS).for_each(multiply);
    }
    // Output transform, by output channel.
    let plane = g.oh * g.ow;
    let finish = |mi: usize, out: &mut [f32]| {
        output_transform(g, &prod[mi * POINTS * t..][..POINTS * t], bias.map_or(0.0, |b| b[mi]), out);
    };
    if parallel {
        y.par_chunks_mut(plane).enumerate().for_each(|(mi, out)| finish(mi, out));
    } else {
        y.chunks_mut(plane).enumerate().for_each(|(mi, out)| finish(mi, out));
    }
}

/// The product matrix shared by the 16 products, which write disjoint rows of it.
struct SharedProducts(*mut f32);

// SAFETY: the products write disjoint elements through it (see `image`), and the matrix outlives them.
unsafe impl Send for SharedProducts {}
// SAFETY: as above.
unsafe impl Sync for SharedProducts {}

/// `V = Bᵀ d B` for every tile of one input channel, into `block` (`[e][tile]`). A tile row at a time: the
/// column transform of each of the tile row's four input rows (from a zero-padded copy of the row), then the row
/// transform across them, both running along the tiles.
fn input_transform(g: &Tiles, plane: &[f32], block: &mut [f32]) {
    let (t, tw) = (g.count(), g.tw);
    let width = 2 * tw + 2;
    let mut padded = vec![0f32; width];
    // cols[r][k][tx]: column transform k of input row r of the tile row.
    let mut cols = vec![0f32; TILE * TILE * tw];
    for ty in 0..g.th {
        for r in 0..TILE {
            let iy = (2 * ty + r).wrapping_sub(g.pt);
            padded.fill(0.0);
            if iy < g.h {
                // Input column ix lands at 2·tx + s = ix + pl.
                let row = &plane[iy * g.w..][..g.w];
                let first = g.pl.min(width);
                let n = g.w.min(width - first);
                padded[first..first + n].copy_from_slice(&row[..n]);
            }
            let (c0, rest) = cols[r * TILE * tw..][..TILE * tw].split_at_mut(tw);
            let (c1, rest) = rest.split_at_mut(tw);
            let (c2, c3) = rest.split_at_mut(tw);
            for tx in 0..tw {
                let d = &padded[2 * tx..2 * tx + 4];
                // Bᵀ's rows are (1,0,-1,0), (0,1,1,0), (0,-1,1,0), (0,1,0,-1).
                c0[tx] = d[0] - d[2];
                c1[tx] = d[1] + d[2];
                c2[tx] = d[2] - d[1];
                c3[tx] = d[1] - d[3];
            }
        }
        for k in 0..TILE {
            let row = |r: usize| &cols[(r * TILE + k) * tw..][..tw];
            let (r0, r1, r2, r3) = (row(0), row(1), row(2), row(3));
            // Rows (i·4 + k)·t + ty·tw of `block` for i = 0..4: four disjoint ranges, 4·t apart.
            let rest = &mut block[k * t + ty * tw..];
            let (o0, rest) = rest.split_at_mut(tw);
            let (o1, rest) = rest[TILE * t - tw..].split_at_mut(tw);
            let (o2, rest) = rest[TILE * t - tw..].split_at_mut(tw);
            let o3 = &mut rest[TILE * t - tw..][..tw];
            for tx in 0..tw {
                o0[tx] = r0[tx] - r2[tx];
                o1[tx] = r1[tx] + r2[tx];
                o2[tx] = r2[tx] - r1[tx];
                o3[tx] = r1[tx] - r3[tx];
            }
        }
    }
}

/// `Y = Aᵀ M A` (+ bias) for every tile of one output channel (`prod`: `[e][tile]`), cropped to the output plane.
/// A tile row at a time, running along the tiles.
fn output_transform(g: &Tiles, prod: &[f32], bias: f32, out: &mut [f32]) {
    let (t, tw) = (g.count(), g.tw);
    // rows[r][col][tx]: Aᵀ applied along row r of the tile row's 4×4 products.
    let mut rows = vec![0f32; TILE * 2 * tw];
    let mut line = vec![0f32; 2 * tw];
    for ty in 0..g.th {
        for r in 0..TILE {
            let m = |k: usize| &prod[(r * TILE + k) * t + ty * tw..][..tw];
            let (m0, m1, m2, m3) = (m(0), m(1), m(2), m(3));
            let (a0, a1) = rows[r * 2 * tw..][..2 * tw].split_at_mut(tw);
            for tx in 0..tw {
                // Aᵀ's rows are (1,1,1,0), (0,1,-1,-1).
                a0[tx] = m0[tx] + m1[tx] + m2[tx];
                a1[tx] = m1[tx] - m2[tx] - m3[tx];
            }
        }
        for row in 0..2 {
            let oy = 2 * ty + row;
            if oy >= g.oh {
                break;
            }
            for col in 0..2 {
                let a = |r: usize| &rows[(r * 2 + col) * tw..][..tw];
                let (a0, a1, a2, a3) = (a(0), a(1), a(2), a(3));
                for tx in 0..tw {
                    let v = if row == 0 { a0[tx] + a1[tx] + a2[tx] } else { a1[tx] - a2[tx] - a3[tx] };
                    line[2 * tx + col] = v + bias;
                }
            }
            out[oy * g.ow..][..g.ow].copy_from_slice(&line[..g.ow]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i * 2654435761 + seed * 97) % 2000) as f32 / 1000.0) - 1.0).collect()
    }

    #[test]
    fn matches_the_direct_convolution() {
        for (n, c, m, h, w, pads) in [
            (1, 3, 4, 5, 5, [1, 1, 1, 1]),
            (2, 8, 5, 7, 6, [1, 1, 1, 1]),
            (1, 4, 3, 9, 4, [0, 0, 0, 0]),
            (1, 2, 2, 6, 7, [2, 0, 1, 2]),
            (1, 16, 8, 1, 1, [1, 1, 1, 1]),
        ] {
            let attrs = Conv { strides: vec![1, 1], pads: pads.to_vec(), dilations: vec![1, 1], groups: 1 };
            let x = values(n * c * h * w, 1);
            let wv = values(m * c * 9, 2);
            let bias = values(m, 3);
            let (oh, ow) = (h + pads[0] as usize + pads[2] as usize - 2, w + pads[1] as usize + pads[3] as usize - 2);
            let y_shape = [n, m, oh, ow];
            let mut want = vec![0f32; n * m * oh * ow];
            super::super::conv_f32(
                &x,
                &[n, c, h, w],
                &wv,
                &[m, c, 3, 3],
                Some(&bias),
                &attrs,
                &mut want,
                &y_shape,
                None,
                Par::SERIAL,
            )
            .unwrap();
            let wt = WinogradWeights::transform(&wv, &[m, c, 3, 3]).unwrap();
            for par in [Par::SERIAL, Par { threads: 2 }] {
                let mut got = vec![f32::NAN; want.len()];
                conv_winograd_f32(&x, &[n, c, h, w], &wt, Some(&bias), &attrs, &mut got, &y_shape, par).unwrap();
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                        "case {:?} element {i}: {a} vs {b}",
                        (n, c, m, h, w)
                    );
                }
            }
        }
    }

    #[test]
    fn refuses_what_it_does_not_compute() {
        let strided = Conv { strides: vec![2, 2], pads: vec![1; 4], dilations: vec![1, 1], groups: 1 };
        assert!(!winograd_applies(&[4, 4, 3, 3], &strided));
        let plain = Conv { strides: vec![1, 1], pads: vec![1; 4], dilations: vec![1, 1], groups: 1 };
        assert!(winograd_applies(&[4, 4, 3, 3], &plain));
        assert!(!winograd_applies(&[4, 4, 5, 5], &plain));
        assert!(WinogradWeights::transform(&[0.0; 8], &[1, 1, 2, 4]).is_err());
        let wt = WinogradWeights::transform(&[0.0; 18], &[1, 2, 3, 3]).unwrap();
        let mut y = vec![0f32; 9];
        let err = conv_winograd_f32(&[0.0; 25], &[1, 1, 5, 5], &wt, None, &plain, &mut y, &[1, 1, 3, 3], Par::SERIAL);
        assert!(err.is_err());
    }
}
