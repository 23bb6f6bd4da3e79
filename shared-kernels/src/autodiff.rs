//! Backward passes for lockstep's kernels.
//!
//! Only the forward must be batch invariant (it is what the sampler and trainer compare), so the
//! backward of each op is written with burn's own tensor ops. A tracked op runs its lockstep
//! kernel on the inner cube tensors, then registers a closure that maps the output gradient to
//! the inputs' gradients. Tensors on an autodiff device (`Device::autodiff()`) take this path;
//! tensors on a plain device run the kernel alone.

use burn::tensor::Tensor;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_autodiff::Autodiff;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::Cube;
use std::sync::{Arc, Mutex};

/// The autodiff backend a tracked lockstep tensor lives on.
pub type AdCube = Autodiff<Cube, NoCheckpointing>;
pub type AdTensor = <AdCube as burn_backend::BackendTypes>::FloatTensorPrimitive;

type GradFn<const N: usize> = Box<dyn FnOnce(CubeTensor) -> [Option<CubeTensor>; N] + Send>;

/// The saved backward closure (the state must be Clone + Debug; the closure runs once).
#[derive(Clone)]
pub struct SavedGrad<const N: usize>(Arc<Mutex<Option<GradFn<N>>>>);

impl<const N: usize> std::fmt::Debug for SavedGrad<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SavedGrad")
    }
}

#[derive(Debug)]
struct ClosureBackward;

impl<const N: usize> Backward<Cube, N> for ClosureBackward {
    type State = SavedGrad<N>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let grad = grads.consume::<Cube>(&ops.node);
        let f = ops.state.0.lock().expect("backward closure lock").take().expect("backward runs once");
        let input_grads = f(grad);
        for (parent, g) in ops.parents.iter().zip(input_grads) {
            if let (Some(node), Some(g)) = (parent, g) {
                grads.register::<Cube>(node.id, g);
            }
        }
    }
}

/// Wraps `output` (computed from `inputs`' primitives) as a tracked tensor whose gradient
/// w.r.t. each input is given by `backward(d_output)`.
pub fn tracked<const N: usize>(
    inputs: [&AdTensor; N],
    output: CubeTensor,
    backward: impl FnOnce(CubeTensor) -> [Option<CubeTensor>; N] + Send + 'static,
) -> AdTensor {
    let guards = inputs.map(|t| t.node());
    match ClosureBackward.prepare::<NoCheckpointing>(guards).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(SavedGrad(Arc::new(Mutex::new(Some(Box::new(backward) as GradFn<N>)))), output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}

/// The tensor as an autodiff primitive, or back unchanged when it is not on an autodiff device.
pub fn as_tracked<const D: usize>(t: Tensor<D>) -> Result<AdTensor, Tensor<D>> {
    if !t.device().is_autodiff() {
        return Err(t);
    }
    t.try_into_primitive::<AdCube>().map_err(|e| panic!("autodiff tensor that is not on a cubecl device: {e:?}"))
}

pub fn from_tracked<const D: usize>(t: AdTensor) -> Tensor<D> {
    Tensor::from_primitive::<AdCube>(t)
}

/// The untracked inner cube tensor of a tracked one (for running the kernel).
pub fn inner(t: &AdTensor) -> CubeTensor {
    t.clone().into_primitive()
}

/// View a cube tensor as a plain burn tensor, for writing backward passes with burn's ops.
pub fn plain<const D: usize>(t: CubeTensor) -> Tensor<D> {
    Tensor::from_primitive::<Cube>(t)
}

pub fn cube<const D: usize>(t: Tensor<D>) -> CubeTensor {
    t.try_into_primitive::<Cube>().expect("plain cube tensor")
}

/// Column sums of `x` [rows, cols] as f32 [cols], for weight gradients summed over tokens.
/// burn's reduce (autotune off) hands each group of 4 columns to one unit that walks every row
/// (32 units for a q/k-norm gradient over 16K rows): measured inside a training step on the
/// H200, 0.46 ms per launch and a third of the step's GPU time; along rows of the transpose it
/// still gives each row to one unit. So: the transpose copied contiguous, then
/// [`crate::ops::reduce::row_sums`], one cube per column, in a fixed order.
pub fn column_sums(x: Tensor<2>) -> Tensor<1> {
    let transposed = burn_cubecl::kernel::into_contiguous(cube(x.swap_dims(0, 1)));
    crate::ops::reduce::row_sums(plain::<2>(transposed)).expect("column_sums: a non-empty float matrix on the op's device")
}

/// `t` as a tracked primitive; an error naming `op` and `name` when it is not on an autodiff
/// device while the op's first input is.
pub fn tracked_in<const D: usize>(op: &'static str, name: &str, t: Tensor<D>) -> Result<AdTensor, crate::KernelError> {
    as_tracked(t).map_err(|_| crate::KernelError::new(op, format!("`{name}` is not on an autodiff device but the op's first input is")))
}

/// The plain (non-autodiff) view of an auxiliary input (ids, positions, temperatures) that was
/// created on an autodiff device.
pub fn untracked<const D: usize, K: burn::tensor::kind::Autodiff>(t: Tensor<D, K>) -> Tensor<D, K> {
    if t.is_autodiff() { t.inner() } else { t }
}
