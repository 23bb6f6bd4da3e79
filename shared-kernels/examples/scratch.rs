use burn::tensor::{DType, Tensor, TensorData};
use shared_kernels::battery::*;
fn show<const D: usize>(name: &str, t: Result<Tensor<D>, shared_kernels::KernelError>) {
    match t {
        Ok(t) => match t.try_into_data() { Ok(d) => println!("{name}: ok {:?}", &d.convert::<f32>().try_to_vec::<f32>().unwrap()[..2]), Err(e) => println!("{name}: EXEC ERR {}", format!("{e:?}").lines().take(12).collect::<Vec<_>>().join(" | ")) },
        Err(e) => println!("{name}: {e}"),
    }
}
fn main() {
    let d = shared_kernels::device::default_device();
    let f = |n: usize| float_tensor((0..n).map(|i| (i as f32 * 0.37).sin()).collect(), [n], DType::F32, &d);
    let f2 = |r: usize, c: usize| float_tensor((0..r*c).map(|i| (i as f32 * 0.37).sin()).collect(), [r, c], DType::F32, &d);
    show("add", shared_kernels::add(f(10), f(10)));
    show("swiglu", shared_kernels::swiglu(f(10), f(10)));
    show("matmul", shared_kernels::matmul(f2(3, 4), f2(5, 4), shared_kernels::WeightLayout::OutIn));
    show("rmsnorm", shared_kernels::rmsnorm(f2(3, 4), f(4), 1e-6));
    show("embedding", shared_kernels::embedding(f2(5, 4), int_tensor(vec![1, 2], &d)));
    let tables = shared_kernels::RopeTables::new(4, 10, 10000.0, &d).unwrap();
    show("rope", shared_kernels::rope(f2(2, 8).reshape([2, 2, 4]), int_tensor(vec![1, 2], &d), &tables));
    let lp = shared_kernels::token_logprobs(f2(2, 10), int_tensor(vec![1, 2], &d), Tensor::<1>::from_data(TensorData::new(vec![1.0f32, 0.5], [2]), &d)).map(|o| o.logprobs);
    show("logprob", lp);
    let s = shared_kernels::sample(f2(2, 10), &[shared_kernels::SamplingRow { temperature: 1.0, top_k: 3, top_p: 0.9, rng_key: 5 }; 2]).map(|o| o.1);
    show("sample", s);
    let cache = float_tensor(vec![0.3; 2*8*1*4], [2, 8, 1, 4], DType::F32, &d);
    show("attention", shared_kernels::attention(f2(2, 8).reshape([2, 2, 4]), cache.clone(), cache.clone(), int_tensor(vec![0, 1], &d), int_tensor(vec![3, 7], &d), 0.5));
    let w = shared_kernels::write_kv_cache(cache, f2(2, 4).reshape([2, 1, 4]), int_tensor(vec![0, 1], &d), int_tensor(vec![3, 7], &d)).map(|t| t.reshape([64]));
    show("write_kv", w);
}
