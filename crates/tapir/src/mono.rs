//! Instances of the engine's generic code for `f32` and `f64`, compiled once here.
//!
//! Nearly all of the engine is generic over [`Float`]. Left alone, every crate, test and
//! example that uses it compiles its own copy of the kernels, the rules and the backward
//! walk for the types it uses. In the unoptimised and `opt-level = 1` builds of the dev
//! profile rustc shares generic instances between crates (`-Z share-generics`, on by
//! default there): a crate that finds `Var::<f32>::tanh` already compiled in this rlib
//! links to it instead of compiling it again. [`INSTANCES`] names a function per type
//! that calls each op, both backward passes and the recorded derivative, so that those
//! instances exist here. It never runs. Release builds do not share generics, so it
//! changes nothing there (docs/architecture.md, "Cold build").

use crate::dtype::Float;
use crate::graph::graph::Graph;
use crate::ops::conv::conv2d::Conv2dOptions;
use crate::params::ParamStore;
use crate::tensor::Tensor;

/// Kept in the rlib by `#[used]`: the roots from which rustc instantiates the engine.
#[used]
static INSTANCES: [fn() -> crate::error::Result<()>; 2] = [exercise::<f32>, exercise::<f64>];

/// Records every op once, then runs backward, `backward_into` and `grad` over them.
fn exercise<T: Float>() -> crate::error::Result<()> {
    let x = Tensor::<T>::zeros(&[2, 3])?;
    let w = Tensor::<T>::zeros(&[3, 2])?;
    let b = Tensor::<T>::zeros(&[2])?;
    let row = Tensor::<T>::zeros(&[3])?;
    let mask = Tensor::<T>::zeros(&[2, 3])?;
    let img = Tensor::<T>::zeros(&[1, 1, 4, 4])?;
    let att = Tensor::<T>::zeros(&[1, 1, 2, 2])?;
    let mut store = ParamStore::<T>::new();
    let p = store.add("p", Tensor::<T>::zeros(&[2, 3])?)?;
    let mut grads = store.zeros_like()?;
    let mut graph = Graph::<T>::new();
    graph.scope(|s| {
        let (x, w, img) = (s.leaf(&x), s.leaf(&w), s.leaf(&img));
        let y = s.param(&store, p);
        let one = T::from_f64(1.0);
        let unary = [
            -x,
            x + one,
            x * one,
            x.powf(one),
            x.exp(),
            x.log(),
            x.log1p(),
            x.expm1(),
            x.sqrt(),
            x.rsqrt(),
            x.square(),
            x.recip(),
            x.abs(),
            x.sin(),
            x.cos(),
            x.tanh(),
            x.atan(),
            x.erf(),
            x.sigmoid(),
            x.relu(),
            x.leaky_relu(one),
            x.gelu(),
            x.gelu_tanh(),
            x.softplus(),
            x.silu(),
            x.clamp(one, one),
        ];
        let binary = [x + y, x - y, x * y, x / y, x.pow(y), x.maximum(y), x.minimum(y)];
        let qkv = x.reshape(&[1, 2, 3]);
        let rest = [
            x.matmul(w).sum(),
            x.linear(w, s.leaf(&b)).sum(),
            x.layer_norm(s.leaf(&row), s.leaf(&row), 1e-5).sum(),
            s.leaf(&att).attend(qkv).sum(),
            qkv.attention_weights(1, true).sum(),
            x.permute(&[1, 0]).sum(),
            x.transpose(0, 1).sum(),
            x.broadcast_to(&[4, 2, 3]).sum(),
            x.narrow(1, 1, 2).sum(),
            s.concat(&[x, y], 0).sum(),
            s.stack(&[x, y], 0).sum(),
            x.index_select(0, &[1, 0]).sum(),
            s.where_(s.input(&mask), x, y).sum(),
            x.sum_axes(&[1], true).sum(),
            x.mean_axes(&[1], true).sum(),
            x.max_axes(&[1], true).sum(),
            x.min_axes(&[1], true).sum(),
            x.logsumexp(1, true).sum(),
            x.softmax(1).sum(),
            x.log_softmax(1).sum(),
            x.cross_entropy(&[0, 2]),
            x.nll_loss(&[0, 2]),
            x.bce_with_logits(y),
            x.mse_loss(y),
            img.im2col([2, 2], [1, 1], [0, 0]).sum(),
            img.max_pool2d([2, 2], [2, 2], [0, 0]).sum(),
            img.avg_pool2d([2, 2], [2, 2], [0, 0]).sum(),
            img.conv2d(img, [1, 1], [0, 0]).sum(),
            img.im2col_dilated([2, 2], [1, 1], [0, 0], [2, 2]).sum(),
            img.max_pool2d_dilated([2, 2], [1, 1], [0, 0], [2, 2]).sum(),
            img.reshape(&[1, 2, 2, 4]).conv2d_with(img.reshape(&[2, 1, 2, 4]), Conv2dOptions::new().groups(2)).sum(),
            img.reshape(&[1, 4, 4]).col2im_dilated([4, 4], [2, 2], [2, 2], [0, 0], [1, 1]).sum(),
            x.pad_axis(1, 1, 2).sum(),
            x.scatter_add(0, &[1, 0], 3).sum(),
            img.reshape(&[1, 4, 4]).col2im([4, 4], [2, 2], [2, 2], [0, 0]).sum(),
            x.mean(),
        ];
        let mut loss = s.zeros(&[]);
        for v in unary.into_iter().chain(binary) {
            loss = loss + v.sum();
        }
        for v in rest {
            loss = loss + v;
        }
        let [dx] = s.grad(loss, [x])?;
        let _ = s.vjp(loss, s.scalar(one), [x])?;
        s.backward_into(dx.sum(), &mut grads)?;
        Ok(())
    })?;
    let _ = graph.scope(|s| s.backward(s.leaf(&x).tanh().sum()));
    Ok(())
}
