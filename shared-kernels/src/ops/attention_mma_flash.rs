//! Flash prefill with the scores in registers (CUDA, sm_80+): the same arithmetic as
//! [`super::attention_tc_flash`], operation for operation, so the same bits as the decode path
//! (per-split partials + combine), with the work laid out as flash attention lays it out.
//!
//! Why: the `cmma` flash kernel passes every product through shared memory (`cmma` fragments
//! have no register layout a kernel may read) and syncs the whole cube five times per split,
//! with 32 queries per cube (ncu: 17% occupancy, stalled on shared memory; 11-13x torch's SDPA).
//! Here each warp owns 16 queries and keeps S, P and O in `mma.sync` fragments, whose layout PTX
//! defines; the cube syncs only to refill the K/V stages, which `cp.async` fills one split ahead.
//!
//! Bits, against the partial kernel's steps (see [`super::attention_tc`]):
//! - S = Q Kᵀ: `mma.m16n8k16` chains over head_dim, k ascending from zero, f32 accumulators. A
//!   `cmma` 16x16x16 is two such instructions on the same fragments (battery: `mma = cmma`).
//! - a query's split max over its valid scaled scores (max is exact in any order: a quad of
//!   lanes holds a row, reduced by shuffles);
//! - p = exp(s * scale - max) rounded to the input dtype (`cvt.rn`, the rounding of a cast);
//!   the split sum l is four sums of 16 keys each in key order, added in quarter order: P goes
//!   through a per-warp shared stage once so one lane can add a quarter in key order;
//! - O = P V: the rounded P as the A fragment straight from registers, keys ascending from
//!   zero in chunks of 16; folded into the output as the combine folds a partial.
//! The two passes (the max over splits, then the splits again) are [`super::attention_tc_flash`]'s.

use super::attention::{keys_in_split, KV_SPLIT};
use super::attention_tc::PAD;
use super::matmul_wgmma::shared_address;
use super::reduce::{cube_linear, NEG_BIG};
use burn_cubecl::cubecl::prelude::barrier::copy_async_checked;
use burn_cubecl::cubecl::prelude::*;

/// Warps per cube; warp w owns queries 16w .. 16w + 15 of the tile.
pub const MMA_WARPS: usize = 4;
/// Queries per cube.
pub const MMA_QUERIES: usize = 16 * MMA_WARPS;
const LANES: usize = 32;
const UNITS: usize = MMA_WARPS * LANES;
/// u32 words (two 16-bit p) per row of a warp's P stage: 32 + 4, so a quad's stores of 8 rows
/// hit 32 different banks.
const LDPW: usize = KV_SPLIT / 2 + 4;
const SMEM_ALIGN: usize = 128;

/// `mma.sync.m16n8k16` with f32 accumulators: d = a b + c (fragments as PTX lays them out).
#[cube]
#[allow(clippy::too_many_arguments)]
fn mma16816(a0: u32, a1: u32, a2: u32, a3: u32, b0: u32, b1: u32, c0: f32, c1: f32, c2: f32, c3: f32, #[comptime] f16: bool) -> Vector<f32, Const<4>> {
    let ptx = comptime!(if f16 { "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" } else { "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" });
    let d: Vector<f32, Const<4>>;
    gpu_asm!(
        "{ptx} {d}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{c0}, {c1}, {c2}, {c3}}};",
        d = out(_) d,
        a0 = in(_) a0,
        a1 = in(_) a1,
        a2 = in(_) a2,
        a3 = in(_) a3,
        b0 = in(_) b0,
        b1 = in(_) b1,
        c0 = in(_) c0,
        c1 = in(_) c1,
        c2 = in(_) c2,
        c3 = in(_) c3,
        options(pure, nomem)
    );
    d
}

/// Four 8x8 16-bit matrices from shared memory (`ldmatrix .x4`): lane i gives the address of row
/// i % 8 of matrix i / 8; `trans` delivers each matrix transposed.
#[cube]
fn ldmatrix_x4(addr: u32, #[comptime] trans: bool) -> Vector<u32, Const<4>> {
    let ptx = comptime!(if trans { "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" } else { "ldmatrix.sync.aligned.m8n8.x4.shared.b16" });
    let out: Vector<u32, Const<4>>;
    gpu_asm!("{ptx} {out}, [{addr}];", out = out(_) out, addr = in(_) addr);
    out
}

/// Two f32 rounded to the dtype (the cast the partial kernel applies to p) in one word, `lo` in
/// the low half: a row's two adjacent columns of an `mma` A fragment.
#[cube]
fn pack_pair<F: Float>(lo: f32, hi: f32) -> u32 {
    let l = u16::reinterpret(F::cast_from(lo));
    let h = u16::reinterpret(F::cast_from(hi));
    u32::cast_from(l) | (u32::cast_from(h) << 16u32)
}

/// The dtype value in the low (`high` false) or high half of `w`, as f32 (exact).
#[cube]
fn unpack_half<F: Float>(w: u32, #[comptime] high: bool) -> f32 {
    let mut bits = w & 0xffffu32;
    if comptime!(high) {
        bits = w >> 16u32;
    }
    f32::cast_from(F::reinterpret(u16::cast_from(bits)))
}

/// Keys `first_pos .. first_pos + staged` of `kv_head` into the `[64][head_dim + PAD]` stage at
/// vector `base`, asynchronously; rows past `staged` are zero-filled by the copy.
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage_split_async<F: Float, N: Size>(
    cache: &Tensor<Vector<F, N>>,
    stage: &mut Shared<[Vector<F, N>]>,
    base: usize,
    first_pos: usize,
    kv_heads: usize,
    kv_head: usize,
    staged: usize,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
) {
    let hd_vecs = comptime!(head_dim / vs);
    let ld_vecs = comptime!((head_dim + PAD) / vs);
    #[unroll]
    for it in 0..comptime!((KV_SPLIT * head_dim / vs).div_ceil(UNITS)) {
        let i = UNIT_POS as usize + it * comptime!(UNITS);
        if i < comptime!(KV_SPLIT * head_dim / vs) {
            let j = i / hd_vecs;
            let mut from = 0usize;
            let mut len = 0usize;
            if j < staged {
                from = ((first_pos + j) * kv_heads + kv_head) * hd_vecs + i % hd_vecs;
                len = 1;
            }
            let to = base + j * ld_vecs + i % hd_vecs;
            copy_async_checked(&cache.slice(from, from + len), &mut stage.slice_mut(to, to + 1), comptime!(vs as u32));
        }
    }
}

#[cube]
fn commit_copies() {
    gpu_asm!("cp.async.commit_group;");
}

#[cube]
fn wait_copies(#[comptime] pending: usize) {
    gpu_asm!("cp.async.wait_group {n};", n = const pending);
}

/// Issues step `step`'s copies: pass 1 (`step < used`) stages split `step`'s keys, pass 2 split
/// `step - used`'s keys and values, into buffer `step % 2`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn issue_step<F: Float, N: Size>(
    k_cache: &Tensor<Vector<F, N>>,
    v_cache: &Tensor<Vector<F, N>>,
    k_sh: &mut Shared<[Vector<F, N>]>,
    v_sh: &mut Shared<[Vector<F, N>]>,
    step: usize,
    used: usize,
    most_keys: usize,
    row0: usize,
    kv_heads: usize,
    kv_head: usize,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
) {
    let stage_vecs = comptime!(KV_SPLIT * (head_dim + PAD) / vs);
    let mut split = step;
    if step >= used {
        split = step - used;
    }
    let first = split * comptime!(KV_SPLIT);
    let staged = keys_in_split(most_keys, first);
    let base = (step % 2) * stage_vecs;
    stage_split_async::<F, N>(k_cache, k_sh, base, row0 + first, kv_heads, kv_head, staged, head_dim, vs);
    if step >= used {
        stage_split_async::<F, N>(v_cache, v_sh, base, row0 + first, kv_heads, kv_head, staged, head_dim, vs);
    }
}

/// S = Q Kᵀ for this warp's 16 queries against the 64 keys staged at byte address `k_addr`:
/// `s[nt * 4 + c]` is fragment element c of key block nt (keys 8 nt ..), k over head_dim
/// ascending from zero.
#[cube]
fn warp_scores(qa: &Array<u32>, k_addr: u32, s: &mut Array<f32>, #[comptime] head_dim: usize, #[comptime] f16: bool) {
    let lane = UNIT_POS_X;
    let ld_bytes = comptime!(((head_dim + PAD) * 2) as u32);
    #[unroll]
    for i in 0..32usize {
        s[i] = 0.0f32;
    }
    // lane i addresses row i % 8 of matrix i / 8: keys 8 (i / 16) + i % 8, dims 8 ((i / 8) % 2)
    let lane_addr = k_addr + ((lane / 16) * 8 + lane % 8) * ld_bytes + ((lane / 8) % 2) * 16;
    #[unroll]
    for kc in 0..comptime!(head_dim / 16) {
        #[unroll]
        for np in 0..4usize {
            let b = ldmatrix_x4(lane_addr + comptime!((np * 16) as u32) * ld_bytes + comptime!((kc * 32) as u32), false);
            #[unroll]
            for h in 0..2usize {
                let nt = comptime!(2 * np + h);
                let d = mma16816(
                    qa[comptime!(kc * 4)],
                    qa[comptime!(kc * 4 + 1)],
                    qa[comptime!(kc * 4 + 2)],
                    qa[comptime!(kc * 4 + 3)],
                    b.extract(comptime!(2 * h)),
                    b.extract(comptime!(2 * h + 1)),
                    s[comptime!(nt * 4)],
                    s[comptime!(nt * 4 + 1)],
                    s[comptime!(nt * 4 + 2)],
                    s[comptime!(nt * 4 + 3)],
                    f16,
                );
                #[unroll]
                for c in 0..4usize {
                    s[comptime!(nt * 4 + c)] = d.extract(c);
                }
            }
        }
    }
}

/// The largest valid scaled score of this lane's row `high` (0: row g, 1: row g + 8) over the
/// quad holding it; NEG_BIG when it has none. Max is exact, so any order gives the row's max.
#[cube]
fn row_max(s: &Array<f32>, valid: usize, scale: f32, #[comptime] high: usize) -> f32 {
    let t = (UNIT_POS_X % 4) as usize;
    let mut m = f32::new(NEG_BIG);
    #[unroll]
    for nt in 0..8usize {
        #[unroll]
        for e in 0..2usize {
            let j = nt * 8 + 2 * t + e;
            let score = s[comptime!(nt * 4 + high * 2 + e)] * scale;
            if j < valid && score > m {
                m = score;
            }
        }
    }
    let other = plane_shuffle_xor(m, 1u32);
    if other > m {
        m = other;
    }
    let other = plane_shuffle_xor(m, 2u32);
    if other > m {
        m = other;
    }
    m
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn mma_flash_kernel<F: Float, N: Size, I: Int>(
    q: &Tensor<Vector<F, N>>,
    k_cache: &Tensor<Vector<F, N>>,
    v_cache: &Tensor<Vector<F, N>>,
    slots: &Tensor<I>,
    positions: &Tensor<I>,
    tiles: &Tensor<I>,
    out: &mut Tensor<F>,
    tiles_arg: u32,
    q_heads_arg: u32,
    kv_heads_arg: u32,
    max_len_arg: u32,
    heads_per_cube_arg: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
    #[comptime] f16: bool,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let q_heads = q_heads_arg as usize;
    let kv_heads = kv_heads_arg as usize;
    let max_len = max_len_arg as usize;
    let hpc = heads_per_cube_arg as usize;
    let group = q_heads / kv_heads;
    let parts = group / hpc;
    let work = cube_linear(); // (tile * kv_heads + kv_head) * parts + part
    let part = work % parts;
    let kv_head = (work / parts) % kv_heads;
    let tile = work / (parts * kv_heads);
    let unit = UNIT_POS as usize;
    let lane = UNIT_POS_X;
    let warp = UNIT_POS_Y as usize;
    let g = (lane / 4) as usize;
    let t = (lane % 4) as usize;
    if tile < tiles_arg as usize {
        let first_row = u32::cast_from(tiles[2 * tile]) as usize;
        let count = u32::cast_from(tiles[2 * tile + 1]) as usize;
        let queries = count * hpc;
        let first_head = kv_head * group + part * hpc;
        let row0 = u32::cast_from(slots[first_row]) as usize * max_len;
        let ld_vecs = comptime!((head_dim + PAD) / vs);
        let hd_vecs = comptime!(head_dim / vs);
        let stage_bytes = comptime!((KV_SPLIT * (head_dim + PAD) * 2) as u32);
        let ld_bytes = comptime!(((head_dim + PAD) * 2) as u32);
        let mut q_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(MMA_QUERIES * (head_dim + PAD) / vs), comptime!(SMEM_ALIGN));
        let mut k_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(2 * KV_SPLIT * (head_dim + PAD) / vs), comptime!(SMEM_ALIGN));
        let mut v_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(2 * KV_SPLIT * (head_dim + PAD) / vs), comptime!(SMEM_ALIGN));
        let mut p_sh = Shared::<[u32]>::new_aligned_slice(comptime!(MMA_WARPS * 16 * LDPW), comptime!(SMEM_ALIGN));
        let mut keys_sh = Shared::<[u32]>::new_slice(comptime!(MMA_QUERIES));

        // every query's prefix length, and the tile's longest
        if unit < comptime!(MMA_QUERIES) {
            let mut keys = 0usize;
            if unit < queries {
                keys = u32::cast_from(positions[first_row + unit / hpc]) as usize + 1;
            }
            keys_sh[unit] = keys as u32;
        }
        // queries as [64][head_dim + PAD], zeros past `queries`
        #[unroll]
        for it in 0..comptime!((MMA_QUERIES * head_dim / vs).div_ceil(UNITS)) {
            let i = unit + it * comptime!(UNITS);
            if i < comptime!(MMA_QUERIES * head_dim / vs) {
                let qi = i / hd_vecs;
                let mut val = Vector::<F, N>::new(F::from_int(0));
                if qi < queries {
                    val = q[((first_row + qi / hpc) * q_heads + first_head + qi % hpc) * hd_vecs + i % hd_vecs];
                }
                q_sh[qi * ld_vecs + i % hd_vecs] = val;
            }
        }
        sync_cube();
        let mut most_keys = 0usize;
        let mut warp_keys = 0usize; // the longest prefix among this warp's queries
        #[unroll]
        for qi in 0..comptime!(MMA_QUERIES) {
            let keys = keys_sh[qi] as usize;
            if keys > most_keys {
                most_keys = keys;
            }
            if qi / 16 == warp && keys > warp_keys {
                warp_keys = keys;
            }
        }
        let keys_lo = keys_sh[warp * 16 + g] as usize;
        let keys_hi = keys_sh[warp * 16 + g + 8] as usize;
        let used = most_keys.div_ceil(comptime!(KV_SPLIT));
        let steps = 2 * used;
        issue_step::<F, N>(k_cache, v_cache, &mut k_sh, &mut v_sh, 0, used, most_keys, row0, kv_heads, kv_head, head_dim, vs);
        commit_copies();

        // this warp's Q fragments: lane i addresses row i % 8 of matrix i / 8: queries
        // 16 w + 8 ((i / 8) % 2) + i % 8, dims 8 (i / 16)
        let mut qa = Array::<u32>::new(comptime!(head_dim / 4));
        let q_addr = shared_address::<Vector<F, N>>(&q_sh) + (warp as u32 * 16 + ((lane / 8) % 2) * 8 + lane % 8) * ld_bytes + (lane / 16) * 16;
        #[unroll]
        for kc in 0..comptime!(head_dim / 16) {
            let a = ldmatrix_x4(q_addr + comptime!((kc * 32) as u32), false);
            #[unroll]
            for r in 0..4usize {
                qa[comptime!(kc * 4 + r)] = a.extract(r);
            }
        }

        let k_base = shared_address::<Vector<F, N>>(&k_sh);
        let v_base = shared_address::<Vector<F, N>>(&v_sh);
        let p_row_lo = (warp * 16 + g) * comptime!(LDPW);
        let p_row_hi = p_row_lo + comptime!(8 * LDPW);
        let mut s = Array::<f32>::new(32usize);
        let mut o = Array::<f32>::new(16usize);
        let mut pa = Array::<u32>::new(16usize);
        let mut acc = Array::<f32>::new(comptime!(head_dim / 2));
        #[unroll]
        for i in 0..comptime!(head_dim / 2) {
            acc[i] = 0.0f32;
        }
        let mut max_lo = f32::new(NEG_BIG);
        let mut max_hi = f32::new(NEG_BIG);
        let mut total_lo = 0.0f32;
        let mut total_hi = 0.0f32;
        for step in 0..steps {
            // the next step's copies go out before this step's wait (one split in flight)
            if step + 1 < steps {
                issue_step::<F, N>(k_cache, v_cache, &mut k_sh, &mut v_sh, step + 1, used, most_keys, row0, kv_heads, kv_head, head_dim, vs);
            }
            commit_copies();
            wait_copies(1usize);
            sync_cube();
            let pass2 = step >= used;
            let mut split = step;
            if pass2 {
                split = step - used;
            }
            let first = split * comptime!(KV_SPLIT);
            let buf = (step % 2) as u32;
            if first < warp_keys {
                let valid_lo = valid_keys(keys_lo, first);
                let valid_hi = valid_keys(keys_hi, first);
                warp_scores(&qa, k_base + buf * stage_bytes, &mut s, head_dim, f16);
                let split_lo = row_max(&s, valid_lo, scale, 0usize);
                let split_hi = row_max(&s, valid_hi, scale, 1usize);
                if !pass2 {
                    // 1. M per query: the largest split max over the splits holding its keys
                    if valid_lo > 0 && split_lo > max_lo {
                        max_lo = split_lo;
                    }
                    if valid_hi > 0 && split_hi > max_hi {
                        max_hi = split_hi;
                    }
                } else {
                    // 2. p rounded to the dtype (0 past a query's keys), as A fragments and
                    // into the warp's P stage
                    #[unroll]
                    for nt in 0..8usize {
                        #[unroll]
                        for h in 0..2usize {
                            let mut valid = valid_lo;
                            let mut m = split_lo;
                            let mut row = p_row_lo;
                            if comptime!(h == 1) {
                                valid = valid_hi;
                                m = split_hi;
                                row = p_row_hi;
                            }
                            let j = nt * 8 + 2 * t;
                            let mut e0 = 0.0f32;
                            let mut e1 = 0.0f32;
                            if j < valid {
                                e0 = (s[comptime!(nt * 4 + 2 * h)] * scale - m).exp();
                            }
                            if j + 1 < valid {
                                e1 = (s[comptime!(nt * 4 + 2 * h + 1)] * scale - m).exp();
                            }
                            let w = pack_pair::<F>(e0, e1);
                            pa[comptime!(nt * 2 + h)] = w;
                            p_sh[row + nt * 4 + t] = w;
                        }
                    }
                    sync_plane();
                    // quarter t of rows g and g + 8, keys in order (p = 0 past `valid` adds
                    // nothing to a sum of non-negative values)
                    let mut quarter_lo = 0.0f32;
                    let mut quarter_hi = 0.0f32;
                    #[unroll]
                    for wi in 0..8usize {
                        let w_lo = p_sh[p_row_lo + t * 8 + wi];
                        quarter_lo += unpack_half::<F>(w_lo, false);
                        quarter_lo += unpack_half::<F>(w_lo, true);
                        let w_hi = p_sh[p_row_hi + t * 8 + wi];
                        quarter_hi += unpack_half::<F>(w_hi, false);
                        quarter_hi += unpack_half::<F>(w_hi, true);
                    }
                    sync_plane(); // the stage is read before the next split writes it
                    let quad = lane - lane % 4;
                    let sum_lo = ((plane_shuffle(quarter_lo, quad) + plane_shuffle(quarter_lo, quad + 1)) + plane_shuffle(quarter_lo, quad + 2)) + plane_shuffle(quarter_lo, quad + 3);
                    let sum_hi = ((plane_shuffle(quarter_hi, quad) + plane_shuffle(quarter_hi, quad + 1)) + plane_shuffle(quarter_hi, quad + 2)) + plane_shuffle(quarter_hi, quad + 3);
                    let mut factor_lo = 0.0f32;
                    let mut factor_hi = 0.0f32;
                    if valid_lo > 0 {
                        factor_lo = (split_lo - max_lo).exp();
                        total_lo += sum_lo * factor_lo;
                    }
                    if valid_hi > 0 {
                        factor_hi = (split_hi - max_hi).exp();
                        total_hi += sum_hi * factor_hi;
                    }
                    // O = P V, 32 output dims at a time; lane i addresses row i % 8 of matrix
                    // i / 8: keys 8 ((i / 8) % 2) + i % 8, dims 8 (i / 16)
                    let v_addr = v_base + buf * stage_bytes + (((lane / 8) % 2) * 8 + lane % 8) * ld_bytes + (lane / 16) * 16;
                    #[unroll]
                    for dg in 0..comptime!(head_dim / 32) {
                        #[unroll]
                        for i in 0..16usize {
                            o[i] = 0.0f32;
                        }
                        #[unroll]
                        for kc in 0..4usize {
                            #[unroll]
                            for np in 0..2usize {
                                let b = ldmatrix_x4(v_addr + comptime!((kc * 16) as u32) * ld_bytes + comptime!(((dg * 32 + np * 16) * 2) as u32), true);
                                #[unroll]
                                for h in 0..2usize {
                                    let nt = comptime!(2 * np + h);
                                    let d = mma16816(
                                        pa[comptime!(kc * 4)],
                                        pa[comptime!(kc * 4 + 1)],
                                        pa[comptime!(kc * 4 + 2)],
                                        pa[comptime!(kc * 4 + 3)],
                                        b.extract(comptime!(2 * h)),
                                        b.extract(comptime!(2 * h + 1)),
                                        o[comptime!(nt * 4)],
                                        o[comptime!(nt * 4 + 1)],
                                        o[comptime!(nt * 4 + 2)],
                                        o[comptime!(nt * 4 + 3)],
                                        f16,
                                    );
                                    #[unroll]
                                    for c in 0..4usize {
                                        o[comptime!(nt * 4 + c)] = d.extract(c);
                                    }
                                }
                            }
                        }
                        // splits past a query's prefix are not folded in (the combine stops
                        // at the query's last split)
                        #[unroll]
                        for i in 0..16usize {
                            let mut valid = valid_lo;
                            let mut factor = factor_lo;
                            if comptime!(i % 4 >= 2) {
                                valid = valid_hi;
                                factor = factor_hi;
                            }
                            if valid > 0 {
                                acc[comptime!(dg * 16 + i)] += o[i] * factor;
                            }
                        }
                    }
                }
            }
            sync_cube(); // every warp is done with this step's buffer before it is refilled
        }

        // 3. out = acc / total; fragment element c of dim block nt: row g (c < 2) or g + 8,
        // dims 8 nt + 2 t + c % 2
        #[unroll]
        for i in 0..comptime!(head_dim / 2) {
            let c = comptime!(i % 4);
            let nt = comptime!(i / 4);
            let mut qi = warp * 16 + g;
            let mut total = total_lo;
            if comptime!(c >= 2) {
                qi += 8;
                total = total_hi;
            }
            if qi < queries {
                let pair = (first_row + qi / hpc) * q_heads + first_head + qi % hpc;
                out[pair * comptime!(head_dim) + nt * 8 + 2 * t + c % 2] = F::cast_from(acc[i] / total);
            }
        }
    }
}

/// Keys of a query with `keys` keys in the split starting at `first` (0 when it has none there).
#[cube]
fn valid_keys(keys: usize, first: usize) -> usize {
    let mut valid = 0usize;
    if first < keys {
        valid = keys_in_split(keys, first);
    }
    valid
}

/// Which kernel runs the prefill (flash) tiles of the tensor-core attention. Both give the bits
/// of the decode path, so the choice changes time only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlashKernel {
    /// This file's kernel: `mma.sync` fragments in registers, 64 queries per cube (CUDA only).
    Mma,
    /// [`super::attention_tc_flash`]'s `cmma` kernel, 32 queries per cube.
    Cmma,
}

impl FlashKernel {
    pub fn parse(text: &str) -> Result<FlashKernel, String> {
        match text.trim() {
            "mma" => Ok(FlashKernel::Mma),
            "cmma" => Ok(FlashKernel::Cmma),
            other => Err(format!("LOCKSTEP_ATTENTION_FLASH={other:?} is not one of mma, cmma")),
        }
    }

    /// Queries one cube of the kernel holds: a prefill tile's rows times the heads per cube.
    pub fn queries(self) -> usize {
        match self {
            FlashKernel::Mma => MMA_QUERIES,
            FlashKernel::Cmma => super::attention_tc::TC_QUERIES,
        }
    }
}

thread_local! {
    static FLASH_OVERRIDE: std::cell::Cell<Option<FlashKernel>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with this thread's prefill tiles on `kernel` (the battery compares the two kernels).
pub fn with_flash_kernel<R>(kernel: FlashKernel, f: impl FnOnce() -> R) -> R {
    let before = FLASH_OVERRIDE.with(|c| c.replace(Some(kernel)));
    let out = f();
    FLASH_OVERRIDE.with(|c| c.set(before));
    out
}

/// The prefill kernel: [`with_flash_kernel`]'s, else `LOCKSTEP_ATTENTION_FLASH` (read once per
/// process), else `mma`; `cmma` off CUDA, where inline PTX does not exist.
pub fn flash_kernel() -> Result<FlashKernel, crate::KernelError> {
    static SETTING: std::sync::OnceLock<Result<Option<FlashKernel>, String>> = std::sync::OnceLock::new();
    let chosen = match FLASH_OVERRIDE.with(|c| c.get()) {
        Some(k) => k,
        None => super::env_setting(&SETTING, "attention", "LOCKSTEP_ATTENTION_FLASH", FlashKernel::parse)?.unwrap_or(FlashKernel::Mma),
    };
    Ok(if crate::device::runtime_name() == "cuda" { chosen } else { FlashKernel::Cmma })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flash_setting_names_the_variable_when_bad() {
        assert_eq!(FlashKernel::parse(" mma "), Ok(FlashKernel::Mma));
        assert_eq!(FlashKernel::parse("cmma"), Ok(FlashKernel::Cmma));
        let e = FlashKernel::parse("wmma").unwrap_err();
        assert!(e.contains("LOCKSTEP_ATTENTION_FLASH") && e.contains("wmma"), "{e}");
    }

    #[test]
    fn the_p_stage_stores_are_free_of_bank_conflicts() {
        // a warp's P-stage stores (rows g, words 4 nt + t) land in 32 different banks
        let banks: std::collections::BTreeSet<usize> = (0..8).flat_map(|g| (0..4).map(move |t| (g * LDPW + t) % 32)).collect();
        assert_eq!(banks.len(), 32);
    }
}
