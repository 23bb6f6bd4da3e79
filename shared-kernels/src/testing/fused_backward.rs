//! The training path's fused backward kernels give the bits of the op chains that define them
//! (burn's f32 tensor ops): the check group `lockstep-battery` runs at a real MLP shape on the
//! H200 and CI runs at small shapes.

use crate::ops::rmsnorm::rmsnorm_with_planes;
use crate::ops::rmsnorm_backward::{rmsnorm_backward_on_planes, rmsnorm_backward_one_launch as rmsnorm_backward, rmsnorm_backward_ops};
use crate::ops::rmsnorm_planes::plane_fits;
use crate::ops::rope::{rope_backward_one_launch as rope_backward, rope_backward_ops, RopeTables};
use crate::ops::swiglu_backward::{swiglu_backward_one_launch as swiglu_backward, swiglu_backward_ops};
use crate::testing::rows::{differing_rows, dtype_name, float_tensor, host, int_tensor, random_vec, row_invariance, Check, BATCH_SIZES};
use crate::KernelError;
use burn::tensor::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Values where the chain's steps overflow, underflow or round to their limits (exp(-g)
/// overflowing to inf, sigmoid saturating at 0 and 1, signed zeros), planted among random ones.
const EDGES: [f32; 12] = [0.0, -0.0, 1.0, -1.0, 88.0, -88.0, 104.0, -104.0, 1e-30, -1e-30, 3.0e38, -3.0e38];

/// One row per fused kernel and input layout: swiglu on `[rows, ffn]` (gate values up to ±12,
/// the edge values planted at the front), rmsnorm on `[rows, hidden]` and per head on
/// `[rows, hidden / 128, 128]` (q/k norm; one row of zeros, one of large values), RoPE's on the
/// latter at random positions, each through the fused kernel and through its op chain, every
/// output element compared as bits; the per-head rows on the plane kernels where the device's
/// planes fit them (forward against the cube kernel); and the rmsnorm kernel's rows in launches
/// of every batch size against the same rows of the whole launch.
pub fn fused_backward_checks(dtype: DType, device: &Device, seed: u64, rows: usize, ffn: usize, hidden: usize) -> Result<Vec<Check>, KernelError> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5b1d);
    let mut out = Vec::new();
    let n = rows * ffn;
    let mut gate = random_vec(&mut rng, n, 12.0);
    for (i, &e) in EDGES.iter().enumerate().take(n) {
        gate[i] = e;
    }
    let t = |v: Vec<f32>| float_tensor(v, [rows, ffn], dtype, device);
    let (g, u, dy) = (t(gate), t(random_vec(&mut rng, n, 4.0)), t(random_vec(&mut rng, n, 1.0)));
    let (dg, du) = swiglu_backward(g.clone(), u.clone(), dy.clone())?;
    let (want_dg, want_du) = swiglu_backward_ops(g, u, dy);
    let (differing, max) = differing_rows(&[(&host(dg), &host(want_dg)), (&host(du), &host(want_du))], ffn);
    out.push(Check { op: format!("swiglu backward {rows}x{ffn}: one launch = burn's f32 op chain"), dtype: dtype_name(dtype), m: rows, rows_differing: differing, max_abs_diff: max });

    let n = rows * hidden;
    let mut x = random_vec(&mut rng, n, 3.0);
    x[..hidden].iter_mut().for_each(|v| *v = 0.0);
    if rows > 1 {
        x[hidden..2 * hidden].iter_mut().for_each(|v| *v *= 1e17);
    }
    let (dy, w) = (random_vec(&mut rng, n, 1.0), random_vec(&mut rng, hidden, 1.5));
    let head = hidden.min(128);
    let w_head = float_tensor(w[..head].to_vec(), [head], dtype, device);
    let w = float_tensor(w, [hidden], dtype, device);
    let eps = 1e-6;
    let flat = |v: &[f32]| float_tensor(v.to_vec(), [rows, hidden], dtype, device);
    let (dx, weighted) = rmsnorm_backward(flat(&x), w.clone(), flat(&dy), eps)?;
    let (want_dx, want_weighted) = rmsnorm_backward_ops(flat(&x), w.clone(), flat(&dy), eps)?;
    let (differing, max) = differing_rows(&[(&host(dx), &host(want_dx)), (&host(weighted), &host(want_weighted))], hidden);
    out.push(Check { op: format!("rmsnorm backward {rows}x{hidden}: one launch = burn's f32 op chain"), dtype: dtype_name(dtype), m: rows, rows_differing: differing, max_abs_diff: max });
    // its one reduction is per row: each row's dx and weight terms are its own whatever rows
    // share the launch
    out.extend(row_invariance(&format!("rmsnorm backward {rows}x{hidden}, one launch"), dtype, rows, &BATCH_SIZES, seed, |idx| {
        let pick = |v: &[f32]| idx.iter().flat_map(|&r| v[r * hidden..(r + 1) * hidden].to_vec()).collect::<Vec<f32>>();
        let rows_of = |v: &[f32]| float_tensor(v.to_vec(), [idx.len(), hidden], dtype, device);
        let (dx, weighted) = rmsnorm_backward(rows_of(&pick(&x)), w.clone(), rows_of(&pick(&dy)), eps)?;
        let (dx, weighted) = (host(dx), host(weighted));
        Ok((0..idx.len()).map(|i| [&dx[i * hidden..(i + 1) * hidden], &weighted[i * hidden..(i + 1) * hidden]].concat()).collect())
    })?);
    if hidden % head == 0 {
        let heads = hidden / head;
        let per_head = |v: &[f32]| -> Tensor<3> { float_tensor(v.to_vec(), [rows, heads, head], dtype, device) };
        let (dx, weighted) = rmsnorm_backward(per_head(&x), w_head.clone(), per_head(&dy), eps)?;
        let (want_dx, want_weighted) = rmsnorm_backward_ops(per_head(&x), w_head.clone(), per_head(&dy), eps)?;
        let (differing, max) = differing_rows(&[(&host(dx), &host(want_dx)), (&host(weighted), &host(want_weighted))], hidden);
        out.push(Check { op: format!("rmsnorm backward per head {rows}x{heads}x{head}: one launch = burn's f32 op chain"), dtype: dtype_name(dtype), m: rows, rows_differing: differing, max_abs_diff: max });
        // the plane kernels (`ops/rmsnorm_planes.rs`) at the device's own plane size: the
        // backward = the op chain, the forward = the cube kernel, rows of 128 only
        if let Some(plane) = crate::fixed_plane_size(device).filter(|&p| plane_fits(p, head)) {
            let (dx, weighted) = rmsnorm_backward_on_planes(plane, per_head(&x), w_head.clone(), per_head(&dy), eps)?;
            let (want_dx, want_weighted) = rmsnorm_backward_ops(per_head(&x), w_head.clone(), per_head(&dy), eps)?;
            let (differing, max) = differing_rows(&[(&host(dx), &host(want_dx)), (&host(weighted), &host(want_weighted))], hidden);
            out.push(Check { op: format!("rmsnorm backward per head {rows}x{heads}x{head} on planes of {plane} = burn's f32 op chain"), dtype: dtype_name(dtype), m: rows, rows_differing: differing, max_abs_diff: max });
            let on_planes = host(rmsnorm_with_planes(Some(plane), per_head(&x), w_head.clone(), eps)?);
            let one_cube_a_row = host(rmsnorm_with_planes(None, per_head(&x), w_head.clone(), eps)?);
            let (differing, max) = differing_rows(&[(&on_planes, &one_cube_a_row)], hidden);
            out.push(Check { op: format!("rmsnorm per head {rows}x{heads}x{head} on planes of {plane} = one cube a row"), dtype: dtype_name(dtype), m: rows, rows_differing: differing, max_abs_diff: max });
            // a row's forward and backward on planes are its own whatever rows share the launch
            // (every battery batch size, random rows and order, against the whole launch)
            out.extend(row_invariance(&format!("rmsnorm per head {rows}x{heads}x{head} on planes of {plane}, forward and backward"), dtype, rows, &BATCH_SIZES, seed ^ 0x91a7, |idx| {
                let pick = |v: &[f32]| idx.iter().flat_map(|&r| v[r * hidden..(r + 1) * hidden].to_vec()).collect::<Vec<f32>>();
                let rows_of = |v: &[f32]| -> Tensor<3> { float_tensor(v.to_vec(), [idx.len(), heads, head], dtype, device) };
                let y = host(rmsnorm_with_planes(Some(plane), rows_of(&pick(&x)), w_head.clone(), eps)?);
                let (dx, weighted) = rmsnorm_backward_on_planes(plane, rows_of(&pick(&x)), w_head.clone(), rows_of(&pick(&dy)), eps)?;
                let (dx, weighted) = (host(dx), host(weighted));
                let row = |v: &[f32], i: usize| v[i * hidden..(i + 1) * hidden].to_vec();
                Ok((0..idx.len()).map(|i| [row(&y, i), row(&dx, i), row(&weighted, i)].concat()).collect())
            })?);
        }
        // RoPE's backward at positions up to 40,960 (Qwen3's context), theta 1e6
        let max_positions = 40_960;
        let tables = RopeTables::new(head, max_positions, 1e6, device)?;
        let positions: Vec<i32> = (0..rows).map(|_| rng.random_range(0..max_positions as i32)).collect();
        let positions = int_tensor(positions, device);
        let (got, want) = (rope_backward(per_head(&dy), positions.clone(), &tables)?, rope_backward_ops(per_head(&dy), positions, &tables));
        let (got, want) = (host(got), host(want));
        let (differing, max) = differing_rows(&[(&got, &want)], hidden);
        out.push(Check { op: format!("rope backward {rows}x{heads}x{head}: one launch = burn's f32 op chain"), dtype: dtype_name(dtype), m: rows, rows_differing: differing, max_abs_diff: max });
    }
    Ok(out)
}
