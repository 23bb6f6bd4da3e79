//! The engine's shared-prefix copy: one launch per layer tensor copies many (from, to, len)
//! prefixes; the copied rows are the source's bits, every other row keeps its bits, and bad
//! copies are errors that name the slots.

use burn::tensor::{DType, Distribution, Tensor};
use shared_kernels::model::{tiny_config, KvCache};

fn bits(t: &Tensor<4>) -> Vec<u32> {
    t.clone().cast(DType::F32).into_data().convert::<f32>().try_to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

#[test]
fn copy_prefixes_copies_the_rows_as_bits_and_leaves_the_rest() {
    let device = crate::device();
    let config = tiny_config(50, false);
    let (slots, max_len) = (6usize, 20usize);
    let mut cache = KvCache::new(&config, slots, max_len, DType::F32, &device);
    // fresh random contents in every layer, K and V
    for (k, v) in cache.layers.iter_mut() {
        *k = Tensor::<4>::random(k.dims(), Distribution::Normal(0.0, 1.0), &device);
        *v = Tensor::<4>::random(v.dims(), Distribution::Normal(0.0, 1.0), &device);
    }
    let before: Vec<(Vec<u32>, Vec<u32>)> = cache.layers.iter().map(|(k, v)| (bits(k), bits(v))).collect();
    // two donors, three recipients, different lengths; a no-op copy onto itself is allowed
    let copies = [(0usize, 3usize, 7usize), (0, 4, 7), (1, 5, 20), (2, 2, 5)];
    cache.copy_prefixes(&copies).unwrap();
    let row = config.num_kv_heads * config.head_dim;
    for (layer, (k, v)) in cache.layers.iter().enumerate() {
        for (got, want) in [(bits(k), &before[layer].0), (bits(v), &before[layer].1)] {
            for slot in 0..slots {
                for pos in 0..max_len {
                    let at = (slot * max_len + pos) * row;
                    let source = copies.iter().find(|&&(f, t, n)| t == slot && f != t && pos < n).map(|&(f, _, _)| f).unwrap_or(slot);
                    let from = (source * max_len + pos) * row;
                    assert_eq!(&got[at..at + row], &want[from..from + row], "layer {layer}, slot {slot}, position {pos} (source slot {source})");
                }
            }
        }
    }
}

#[test]
fn bad_copies_are_errors_that_name_the_slots() {
    let device = crate::device();
    let mut cache = KvCache::new(&tiny_config(50, false), 4, 8, DType::F32, &device);
    let err = cache.copy_prefixes(&[(0, 9, 3)]).unwrap_err().to_string();
    assert!(err.contains("slot 9") && err.contains("outside"), "{err}");
    let err = cache.copy_prefixes(&[(0, 1, 9)]).unwrap_err().to_string();
    assert!(err.contains("9 positions"), "{err}");
    let err = cache.copy_prefixes(&[(0, 1, 3), (1, 2, 3)]).unwrap_err().to_string();
    assert!(err.contains("slot 1") && err.contains("both a source and a destination"), "{err}");
}
