//! A lockstep launch sequence captured into a cubecl graph (what a CUDA-graph decode step would
//! be built on) and replayed after new inputs are written into the captured buffers gives the
//! eager launches' bits. wgpu records a software graph, CUDA a driver graph; the contract is
//! the same.

use burn::tensor::{Tensor, TensorData};
use burn_cubecl::Cube;
use rand::{Rng, SeedableRng};
use shared_kernels::{matmul, rmsnorm, WeightLayout};

fn random(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

#[test]
fn a_captured_rmsnorm_and_matmul_replay_with_new_inputs_gives_the_eager_bits() {
    let device = super::device();
    let mut rng = rand::rngs::StdRng::seed_from_u64(super::seed());
    let (rows, hidden, out) = (5, 64, 96);
    let gain = Tensor::<1>::from_data(TensorData::new(random(&mut rng, hidden), [hidden]), &device);
    let w = Tensor::<2>::from_data(TensorData::new(random(&mut rng, out * hidden), [out, hidden]), &device);
    let step = |x: Tensor<2>| -> Tensor<2> { matmul(rmsnorm(x, gain.clone(), 1e-6).unwrap(), w.clone(), WeightLayout::OutIn).unwrap() };
    let x = Tensor::<2>::from_data(TensorData::new(random(&mut rng, rows * hidden), [rows, hidden]), &device);
    let prim = x.clone().try_into_primitive::<Cube>().ok().unwrap();
    let client = prim.client.clone();
    client.graph_prepare().unwrap();
    let warm = step(x.clone());
    let _ = warm.to_data();
    client.start_capture().unwrap();
    let y = step(x.clone());
    let graph = client.stop_capture().unwrap();
    for _ in 0..3 {
        let fresh = random(&mut rng, rows * hidden);
        let bytes: Vec<u8> = fresh.iter().flat_map(|v| v.to_le_bytes()).collect();
        client.write(&prim.handle, burn::tensor::Bytes::from_bytes_vec(bytes));
        unsafe { graph.replay().unwrap() };
        let replayed: Vec<f32> = y.clone().to_data().try_to_vec::<f32>().unwrap();
        let eager: Vec<f32> = step(Tensor::<2>::from_data(TensorData::new(fresh, [rows, hidden]), &device)).to_data().try_to_vec::<f32>().unwrap();
        assert!(replayed.iter().map(|v| v.to_bits()).eq(eager.iter().map(|v| v.to_bits())), "replay differs from eager");
    }
}
