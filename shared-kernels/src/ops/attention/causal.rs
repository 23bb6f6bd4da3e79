//! The training path's attention: causal self-attention over whole sequences given as rows, on
//! the sampler's own kernels (so its bits equal prefill's and decode's), differentiable, with
//! the backward one sequence at a time or, off the per-sequence path, dense over padded groups.

use super::*;

/// Causal self-attention for whole sequences given as rows (the training path): row r is token
/// `positions[r]` of sequence `slots[r]`, and every sequence's positions 0..len must all be
/// present. It writes the rows' K/V into a fresh cache and runs [`attention`], the very kernels
/// the sampler's prefill and decode run, so its bits equal theirs. Differentiable when the
/// inputs are on an autodiff device (backward: one sequence at a time,
/// [`crate::ops::attention::backward::sequence_backward`], where every sequence's rows are contiguous
/// and in order; else dense attention over padded groups of sequences in burn ops).
pub fn causal_attention(
    q: BTensor<3>,
    k: BTensor<3>,
    v: BTensor<3>,
    slots: &[u32],
    positions: &[u32],
    scale: f32,
) -> Result<BTensor<3>, KernelError> {
    const OP: &str = "causal_attention";
    let rows = slots.len();
    ensure!(positions.len() == rows && q.dims()[0] == rows, OP, "q has {} rows, slots {rows}, positions {}", q.dims()[0], positions.len());
    let lens = sequence_lengths(slots);
    let n_slots = lens.len();
    let mut seen: Vec<Vec<bool>> = lens.iter().map(|&l| vec![false; l]).collect();
    for (&s, &p) in slots.iter().zip(positions) {
        let slot_seen = &mut seen[s as usize];
        ensure!((p as usize) < slot_seen.len() && !slot_seen[p as usize], OP, "sequence {s}: position {p} is repeated or beyond its {} rows; each sequence needs positions 0..len exactly once", slot_seen.len());
        slot_seen[p as usize] = true;
    }
    let max_len = lens.iter().copied().max().unwrap_or(0).max(1);
    if !q.is_autodiff() {
        return Ok(causal_attention_plain(q, k, v, slots, positions, n_slots, max_len, scale, false)?.0);
    }
    let (qa, ka, va) = (tracked_in(OP, "q", q)?, tracked_in(OP, "k", k)?, tracked_in(OP, "v", v)?);
    let (qp, kp, vp) = (plain::<3>(inner(&qa)), plain::<3>(inner(&ka)), plain::<3>(inner(&va)));
    let layout = crate::ops::attention::backward::contiguous_sequences(slots, positions);
    // the training layout: the forward also hands the tensor-core backward its softmax statistics
    let (out, forward_stats) = causal_attention_plain(qp.clone(), kp.clone(), vp.clone(), slots, positions, n_slots, max_len, scale, layout.is_some())?;
    if let Some((starts, seq_lens)) = layout {
        // the training layout: each sequence's backward alone, so its bits are its own
        let sequences: Vec<(usize, usize)> = (0..rows).filter(|&r| starts[r] as usize == r).map(|r| (r, seq_lens[r] as usize)).collect();
        let saved_out = out.clone();
        return Ok(from_tracked(tracked([&qa, &ka, &va], cube(out), move |d_out| {
            let (dq, dk, dv) = crate::ops::attention::backward::sequence_backward(qp, kp, vp, saved_out, plain::<3>(d_out), &sequences, scale, forward_stats)
                .expect("attention backward: shapes checked in forward");
            [Some(cube(dq)), Some(cube(dk)), Some(cube(dv))]
        })));
    }
    let q_heads = qp.dims()[1];
    let groups = backward_groups(&lens, q_heads);
    if let Some(&(first, _, t)) = groups.iter().find(|&&(first, end, t)| (end - first) * q_heads * t * t > u32::MAX as usize) {
        let longest = ((u32::MAX as usize / q_heads) as f64).sqrt() as usize;
        return Err(KernelError::new(OP, format!("sequence {first} has {t} tokens: the dense attention backward's [1, {q_heads}, {t}, {t}] scores exceed the 32-bit index range (at most {longest} tokens a sequence with {q_heads} heads)")));
    }
    // row r sits at place `padded[r]` of the groups' padded rows laid end to end
    let mut group_of = vec![0usize; n_slots];
    let mut group_base = Vec::with_capacity(groups.len());
    let mut base = 0;
    for (g, &(first, end, t)) in groups.iter().enumerate() {
        group_of[first..end].iter_mut().for_each(|x| *x = g);
        group_base.push(base);
        base += (end - first) * t;
    }
    let padded_rows = base;
    let mut place = vec![0i32; rows];
    // per group: padded [sequence, position] -> row index; padding points at an extra all-zero row
    let pad_row = rows as i32;
    let mut index: Vec<Vec<i32>> = groups.iter().map(|&(first, end, t)| vec![pad_row; (end - first) * t]).collect();
    for (r, (&s, &p)) in slots.iter().zip(positions).enumerate() {
        let g = group_of[s as usize];
        let (first, _, t) = groups[g];
        let at = (s as usize - first) * t + p as usize;
        index[g][at] = r as i32;
        place[r] = (group_base[g] + at) as i32;
    }
    Ok(from_tracked(tracked([&qa, &ka, &va], cube(out), move |d_out| {
        // dense attention backward, a group of sequences at a time (each padded to its longest),
        // so the [sequences, heads, t, t] scores stay within BACKWARD_SCORES elements
        let d_out = plain::<3>(d_out);
        let dtype = qp.dtype();
        let device = qp.device();
        let [_, q_heads, head_dim] = qp.dims();
        let kv_heads = kp.dims()[1];
        let group = q_heads / kv_heads;
        let (mut dqs, mut dks, mut dvs) = (Vec::new(), Vec::new(), Vec::new());
        for (g, &(first, end, t)) in groups.iter().enumerate() {
            let b = end - first;
            let idx = BTensor::<1, BInt>::from_data(TensorData::new(index[g].clone(), [b * t]), &device);
            let padded = |x: BTensor<3>, heads: usize| -> BTensor<4> {
                let x = x.cast(DType::F32);
                let zero = BTensor::<3>::zeros([1, heads, head_dim], &device);
                BTensor::cat(vec![x, zero], 0).select(0, idx.clone()).reshape([b, t, heads, head_dim]).swap_dims(1, 2)
            };
            let expand = |x: BTensor<4>| x.unsqueeze_dim::<5>(2).repeat_dim(2, group).reshape([b, q_heads, t, head_dim]);
            // the query heads of one KV head added in head order (burn's reduce over a middle axis
            // of size `group` is one unit per output walking a strided axis: slow, measured)
            let fold = |x: BTensor<4>| {
                let x = x.reshape([b, kv_heads, group, t, head_dim]);
                let head = |h: usize| x.clone().slice([0..b, 0..kv_heads, h..h + 1, 0..t, 0..head_dim]);
                (1..group).fold(head(0), |acc, h| acc + head(h)).reshape([b, kv_heads, t, head_dim])
            };
            let (qs, ks, vs, dos) = (padded(qp.clone(), q_heads), expand(padded(kp.clone(), kv_heads)), expand(padded(vp.clone(), kv_heads)), padded(d_out.clone(), q_heads));
            let mask = causal_mask(&lens[first..end], t, &device);
            let scores = qs.clone().matmul(ks.clone().swap_dims(2, 3)).mul_scalar(scale as f64) + mask;
            let probs = burn::tensor::activation::softmax(scores, 3);
            let d_v = probs.clone().swap_dims(2, 3).matmul(dos.clone());
            let d_p = dos.matmul(vs.swap_dims(2, 3));
            let d_s = probs.clone() * (d_p.clone() - (d_p * probs).sum_dim(3));
            let d_q = d_s.clone().matmul(ks).mul_scalar(scale as f64);
            let d_k = d_s.swap_dims(2, 3).matmul(qs).mul_scalar(scale as f64);
            let flat = |x: BTensor<4>, heads: usize| x.swap_dims(1, 2).reshape([b * t, heads, head_dim]);
            dqs.push(flat(d_q, q_heads));
            dks.push(flat(fold(d_k), kv_heads));
            dvs.push(flat(fold(d_v), kv_heads));
        }
        // each row's gradient is read back from its padded place (a gather: burn's select_assign
        // into zeros took 0.4 ms a call on the H200)
        let row_place = BTensor::<1, BInt>::from_data(TensorData::new(place.clone(), [rows]), &device);
        let unpad = |mut parts: Vec<BTensor<3>>| -> BTensor<3> {
            let all = if parts.len() == 1 { parts.pop().expect("one group") } else { BTensor::cat(parts, 0) };
            debug_assert_eq!(all.dims()[0], padded_rows);
            all.select(0, row_place.clone()).cast(dtype)
        };
        [Some(cube(unpad(dqs))), Some(cube(unpad(dks))), Some(cube(unpad(dvs)))]
    })))
}

/// [`causal_attention`]'s forward on plain tensors with the softmax statistics the training
/// forward hands the tensor-core backward (`None` where that backward or the `mma` flash kernel
/// does not run, or `LOCKSTEP_BACKWARD_STATS=recompute`): the battery's check that they equal
/// the backward's own.
pub fn causal_attention_with_stats(q: BTensor<3>, k: BTensor<3>, v: BTensor<3>, slots: &[u32], positions: &[u32], scale: f32) -> Result<(BTensor<3>, Option<BTensor<1>>), KernelError> {
    ensure!(crate::ops::attention::backward::contiguous_sequences(slots, positions).is_some(), "causal_attention", "the statistics are for the training layout: each sequence's rows contiguous, positions 0..len in order");
    let lens = sequence_lengths(slots);
    let max_len = lens.iter().copied().max().unwrap_or(0).max(1);
    causal_attention_plain(q, k, v, slots, positions, lens.len(), max_len, scale, true)
}

/// Rows per slot, for slots 0 ..= the largest in `slots`.
fn sequence_lengths(slots: &[u32]) -> Vec<usize> {
    let mut lens = vec![0usize; slots.iter().max().map_or(0, |&s| s as usize + 1)];
    for &s in slots {
        lens[s as usize] += 1;
    }
    lens
}

/// Elements of one backward group's `[sequences, heads, t, t]` f32 scores, at most (1 GiB): a
/// step's sequences are walked in order and cut into groups that stay within it (a sequence
/// longer than that alone is its own group). Steps that fit in one group are computed as one
/// padded batch, as before groups existed.
pub const BACKWARD_SCORES: usize = 1 << 28;


/// Consecutive sequences `[first, end)` and their longest length `t`, each group's
/// `(end - first) * heads * t * t` within [`BACKWARD_SCORES`] unless it holds one sequence.
fn backward_groups(lens: &[usize], heads: usize) -> Vec<(usize, usize, usize)> {
    let mut groups = Vec::new();
    let mut first = 0;
    while first < lens.len() {
        let mut end = first + 1;
        let mut t = lens[first].max(1);
        while end < lens.len() {
            let wider = t.max(lens[end]);
            if (end + 1 - first) * heads * wider * wider > BACKWARD_SCORES {
                break;
            }
            t = wider;
            end += 1;
        }
        groups.push((first, end, t));
        first = end;
    }
    groups
}

/// The backward's additive mask `[sequences, 1, t, t]`: -1e30 where key j is after query i or
/// past its sequence's length. Every layer's backward in a step has the same sequences, so the
/// mask is built and uploaded once per step, not once per layer (at 32 x 128 tokens and 28
/// layers that was 14.7 M host iterations and 56 MB of uploads per step); equal content, equal
/// tensor.
fn causal_mask(lens: &[usize], t: usize, device: &burn::tensor::Device) -> BTensor<4> {
    if let Some(mask) = MASKS.with(|masks| masks.borrow().iter().find(|m| m.0 == lens && m.1 == t && &m.2 == device).map(|m| m.3.clone())) {
        return mask;
    }
    let b = lens.len();
    let mut mask = vec![0.0f32; b * t * t];
    for (seq, len) in lens.iter().enumerate() {
        for i in 0..t {
            for j in 0..t {
                if j > i || j >= *len {
                    mask[(seq * t + i) * t + j] = -1.0e30;
                }
            }
        }
    }
    let mask = BTensor::<4>::from_data(TensorData::new(mask, [b, 1, t, t]), device);
    MASKS.with(|masks| {
        let mut masks = masks.borrow_mut();
        masks.insert(0, (lens.to_vec(), t, device.clone(), mask.clone()));
        masks.truncate(CACHED_MASKS);
    });
    mask
}

type MaskEntry = (Vec<usize>, usize, burn::tensor::Device, BTensor<4>);
const CACHED_MASKS: usize = 2;
thread_local! {
    static MASKS: std::cell::RefCell<Vec<MaskEntry>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[allow(clippy::too_many_arguments)]
fn causal_attention_plain(
    q: BTensor<3>,
    k: BTensor<3>,
    v: BTensor<3>,
    slots: &[u32],
    positions: &[u32],
    n_slots: usize,
    max_len: usize,
    scale: f32,
    want_stats: bool,
) -> Result<(BTensor<3>, Option<BTensor<1>>), KernelError> {
    let device = q.device();
    let [_, kv_heads, head_dim] = k.dims();
    let dtype = k.dtype();
    // zeroed in the cache's own dtype (it was an f32 fill and a cast per cache and layer): rows
    // past a sequence's end stay finite for any kernel that stages them
    let empty = || BTensor::<4>::zeros([n_slots, max_len, kv_heads, head_dim], (&device, dtype));
    let ints = |v: &[u32]| BTensor::<1, BInt>::from_data(TensorData::new(v.iter().map(|&x| x as i32).collect::<Vec<_>>(), [v.len()]), &device);
    let (slot_t, pos_t) = (ints(slots), ints(positions));
    // one block table for the two writes and the attention (each layer calls this)
    let shape = KvCacheShape { slots: n_slots, max_len, kv_heads, head_dim };
    let int_dtype = crate::bridge::int_in("causal_attention", "slots", slot_t.clone())?.dtype;
    let pages = BlockRows::contiguous(&shape, int_dtype, &device)?;
    let k_cache = crate::ops::kv_cache::write_kv_cache_paged(empty(), k, slot_t.clone(), pos_t.clone(), Some(&pages))?;
    let v_cache = crate::ops::kv_cache::write_kv_cache_paged(empty(), v, slot_t.clone(), pos_t.clone(), Some(&pages))?;
    if want_stats {
        return attention_for_rows_with_stats(q, k_cache, v_cache, slot_t, pos_t, slots, scale, Some(&pages));
    }
    Ok((attention_for_rows(q, k_cache, v_cache, slot_t, pos_t, slots, scale, Some(&pages))?, None))
}
