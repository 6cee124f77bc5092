//! Layer 3, recording: the handles ([`Scope`](handles::Scope), [`Var`](handles::Var)), the
//! recorder ([`Core`](core::Core)), what rules see ([`Rec`](ctx::Rec),
//! [`BackwardCtx`](ctx::BackwardCtx), [`GradCtx`](ctx::GradCtx)), the per-scope
//! [`State`](state::State), and the plug-in interfaces of custom ops and checkpoints.

pub(crate) mod checkpoint;
pub(crate) mod core;
pub(crate) mod ctx;
pub(crate) mod custom_op;
pub(crate) mod handles;
pub(crate) mod state;
