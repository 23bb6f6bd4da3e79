//! Bad shapes and dtypes get a KernelError naming the op and the shapes, not a panic.

use burn::tensor::{DType, Int, Tensor, TensorData};
use shared_kernels::testing::rows::{float_tensor, int_tensor};
use shared_kernels::{SamplingRow, WeightLayout};

#[test]
fn launchers_reject_bad_inputs_with_named_errors() {
    let device = crate::device();
    let x = float_tensor(vec![0.5; 6], [2, 3], DType::F32, &device);
    let w = float_tensor(vec![0.5; 8], [2, 4], DType::F32, &device);
    let err = shared_kernels::matmul(x.clone(), w, WeightLayout::OutIn).unwrap_err();
    assert_eq!(err.op, "matmul");
    assert!(err.to_string().contains("[2, 3]") && err.to_string().contains("[2, 4]"), "{err}");

    // a tensor-core kernel asked for where there are none (f32 here; lavapipe has no cmma) is an
    // error naming the kernel, not a panic or a silent fallback to other arithmetic
    use shared_kernels::ops::matmul::{matmul_with, MatmulKernel};
    let w_ok = float_tensor(vec![0.5; 12], [4, 3], DType::F32, &device);
    for kernel in [MatmulKernel::TensorCore, MatmulKernel::Pipelined, MatmulKernel::Hybrid] {
        let err = matmul_with(Some(kernel), x.clone(), w_ok.clone(), WeightLayout::OutIn).unwrap_err();
        assert!(err.to_string().contains(kernel.name()) && err.to_string().contains("tensor cores"), "{err}");
    }
    assert!(matmul_with(Some(MatmulKernel::Scalar), x.clone(), w_ok, WeightLayout::OutIn).is_ok());

    let err = shared_kernels::rmsnorm(x.clone(), float_tensor(vec![1.0; 4], [4], DType::F32, &device), 1e-6).unwrap_err();
    assert!(err.to_string().starts_with("rmsnorm:") && err.to_string().contains("weight"), "{err}");

    let err = shared_kernels::rmsnorm(x.clone(), float_tensor(vec![1.0; 3], [3], DType::F32, &device), -1.0).unwrap_err();
    assert!(err.to_string().contains("eps"), "{err}");

    // a row too wide to stage in one cube's shared memory is an error naming the limit
    let wide = 12 * 1024;
    let err = shared_kernels::rmsnorm(float_tensor(vec![0.5; wide], [1, wide], DType::F32, &device), float_tensor(vec![1.0; wide], [wide], DType::F32, &device), 1e-6).unwrap_err();
    assert!(err.to_string().starts_with("rmsnorm:") && err.to_string().contains("40 KB"), "{err}");

    let ints = Tensor::<2, Int>::from_data(TensorData::new(vec![1i32; 6], [2, 3]), &device).float();
    let _ = ints; // int->float is a valid float tensor; dtype errors come from non-float dtypes below

    let err = shared_kernels::add(x.clone(), float_tensor(vec![0.5; 4], [2, 2], DType::F32, &device)).unwrap_err();
    assert!(err.to_string().contains("shapes differ"), "{err}");

    let logits = float_tensor(vec![0.1; 6], [2, 3], DType::F32, &device);
    let err = shared_kernels::sample(logits.clone(), &[SamplingRow { temperature: -1.0, top_k: 0, top_p: 1.0, rng_key: 1, processed: false }; 2]).unwrap_err();
    assert!(err.to_string().contains("temperature"), "{err}");
    let err = shared_kernels::sample(logits.clone(), &[SamplingRow { temperature: 1e-45, top_k: 0, top_p: 1.0, rng_key: 1, processed: false }; 2]).unwrap_err();
    assert!(err.to_string().contains("temperature") && err.to_string().contains("overflows"), "{err}");
    let err = shared_kernels::sample(logits.clone(), &[SamplingRow { temperature: 1.0, top_k: 0, top_p: 1.5, rng_key: 1, processed: false }; 2]).unwrap_err();
    assert!(err.to_string().contains("top_p"), "{err}");
    let err = shared_kernels::sample(logits.clone(), &[SamplingRow { temperature: 1.0, top_k: 0, top_p: 1.0, rng_key: 1, processed: false }; 3]).unwrap_err();
    assert!(err.to_string().contains("2 rows"), "{err}");

    let q = float_tensor(vec![0.1; 2 * 3 * 4], [2, 3, 4], DType::F32, &device);
    let cache = float_tensor(vec![0.1; 2 * 5 * 2 * 4], [2, 5, 2, 4], DType::F32, &device);
    let err = shared_kernels::attention(q, cache.clone(), cache, int_tensor(vec![0, 1], &device), int_tensor(vec![0, 1], &device), 0.5).unwrap_err();
    assert!(err.to_string().contains("q_heads 3") && err.to_string().contains("kv_heads 2"), "{err}");

    let temps = Tensor::<1>::from_data(TensorData::new(vec![1.0f32; 2], [2]), &device);
    let err = shared_kernels::token_logprobs(logits, int_tensor(vec![0, 1, 2], &device), temps).unwrap_err();
    assert!(err.to_string().contains("targets"), "{err}");

    // the tensor-core benchmark kernel names the dtype it has no instruction for
    let err = shared_kernels::ops::probes::mma_peak::mma_peak(&device, DType::F32, 4, 4).unwrap_err();
    assert!(err.to_string().contains("mma_peak") && err.to_string().contains("F32"), "{err}");
}
