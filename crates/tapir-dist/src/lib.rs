//! # tapir-dist
//!
//! Data-parallel training for [`tapir`] and [`tapir_nn`] over MPI: every process (rank)
//! holds the whole model, computes gradients on its shard of each global batch, and the
//! gradients are averaged across ranks before every optimizer step, as with PyTorch's
//! `DistributedDataParallel` or Horovod.
//!
//! - [`DataParallel`]: broadcasts rank 0's parameters at start (and refuses a rank whose
//!   model differs), averages gradients in one collective per step, accumulates
//!   micro-batches without communication, averages metrics, and turns an error or panic
//!   on any rank into an error on every rank.
//! - [`DistributedSampler`]: seeded, disjoint shards of each epoch's global batches.
//! - [`checkpoint`]: resumable checkpoints (parameters, optimizer state, schedule step,
//!   sampler position, RNG states) in one safetensors file.
//! - [`Comm`]: the collectives used, implemented by [`Local`] (one process, no MPI) and,
//!   with the `mpi` feature, by `Mpi` (rsmpi over the system's MPI library).
//!
//! The MPI backend is behind the non-default `mpi` feature, so the workspace builds and
//! tests without an MPI library; `just test-mpi` runs the multi-rank tests under mpirun.
//! Launching, determinism and failure behaviour are described in `docs/distributed.md`.
//!
//! ```
//! use tapir::{Graph, ParamStore, Tensor};
//! use tapir_dist::{DataParallel, DistributedSampler, Local};
//! use tapir_nn::optim::{Optimizer, Sgd};
//! # fn main() -> Result<(), tapir_dist::Error> {
//! let mut store = ParamStore::<f64>::new();
//! let w = store.add("w", Tensor::zeros(&[1])?)?;
//! // With MPI: inside `tapir_dist::Mpi::run(|comm| ...)`, `DataParallel::new(comm, ...)`,
//! // and the same code on every rank.
//! let mut dp = DataParallel::new(Local, &mut store)?;
//! let mut sampler = DistributedSampler::new(8, 4, dp.rank(), dp.size(), 0)?;
//! let xs: Vec<f64> = (0..8).map(f64::from).collect();
//! let (mut grads, mut opt, mut graph) = (store.zeros_like()?, Sgd::new(&store, 0.1)?, Graph::new());
//! while let Some(shard) = sampler.next_shard() {
//!     let x = Tensor::from_vec(shard.iter().map(|&i| xs[i]).collect(), &[shard.len(), 1])?;
//!     dp.step(&mut grads, |grads| {
//!         graph.scope(|s| {
//!             // L = mean_i (w − x_i)²
//!             let loss = (s.param(&store, w) - s.input(&x)).square().mean();
//!             s.backward_into(loss, grads)
//!         })?;
//!         Ok::<_, tapir::Error>(shard.len())
//!     })?;
//!     opt.step(&mut store, &grads)?;
//! }
//! # Ok(()) }
//! ```

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod checkpoint;
mod comm;
mod data_parallel;
mod error;
mod fault;
#[cfg(feature = "mpi")]
mod mpi_comm;
mod sampler;

pub use comm::{Comm, Local};
pub use data_parallel::{params_hash, DataParallel, Reduced, Reduction};
pub use error::{Error, Result};
#[cfg(feature = "mpi")]
pub use mpi_comm::Mpi;
pub use sampler::{DistributedSampler, SamplerState, SplitMix64};
