//! The crate's single error type.
//!
//! Every message starts with the op's name, prints every shape involved, says what would
//! have been valid where that is short, and ends with the caller's source location (taken
//! with `#[track_caller]`), so a failure in a long model points at the line that caused it.

use std::panic::Location;

use crate::shape::Shape;

/// A caller's source location, as recorded by `#[track_caller]`.
pub type Loc = &'static Location<'static>;

/// `std::result::Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when building, differentiating or loading tensors.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Two shapes had to be equal.
    #[error("{op}: shapes {lhs} and {rhs} must be equal (at {location})")]
    ShapeMismatch {
        /// The op.
        op: &'static str,
        /// First operand's shape.
        lhs: Shape,
        /// Second operand's shape.
        rhs: Shape,
        /// Caller's location.
        location: Loc,
    },
    /// Two shapes cannot be broadcast together.
    #[error("{op}: shapes {lhs} and {rhs} cannot be broadcast (aligned from the right, each pair of dimensions must be equal or contain a 1) (at {location})")]
    Broadcast {
        /// The op.
        op: &'static str,
        /// First operand's shape.
        lhs: Shape,
        /// Second operand's shape (or the target shape of `broadcast_to`).
        rhs: Shape,
        /// Caller's location.
        location: Loc,
    },
    /// Matrix product with incompatible shapes.
    #[error("matmul: {lhs} × {rhs} needs rank >= 2, lhs columns == rhs rows and broadcastable batch dimensions (at {location})")]
    MatMulShape {
        /// Left operand's shape.
        lhs: Shape,
        /// Right operand's shape.
        rhs: Shape,
        /// Caller's location.
        location: Loc,
    },
    /// An axis outside the tensor's rank.
    #[error("{op}: axis {axis} is out of range for shape {shape} (valid: -{rank}..{rank}) (at {location})", rank = shape.rank())]
    BadAxis {
        /// The op.
        op: &'static str,
        /// The axis as given.
        axis: isize,
        /// The operand's shape.
        shape: Shape,
        /// Caller's location.
        location: Loc,
    },
    /// An invalid shape argument: wrong element count, rank above 6, overflow, bad permutation.
    #[error("{op}: {detail} (input shape {shape}) (at {location})")]
    InvalidShape {
        /// The op.
        op: &'static str,
        /// The operand's shape.
        shape: Shape,
        /// What is wrong, with the requested dimensions.
        detail: String,
        /// Caller's location.
        location: Loc,
    },
    /// Shapes given as a list (concat, stack) disagree.
    #[error("{op}: shapes {} disagree along axes other than {axis} (at {location})", list(.shapes))]
    ShapeList {
        /// The op.
        op: &'static str,
        /// Every operand's shape.
        shapes: Vec<Shape>,
        /// The concatenation axis.
        axis: usize,
        /// Caller's location.
        location: Loc,
    },
    /// An index or class label out of range.
    #[error("{op}: index {index} is out of range for dimension of size {len} (shape {shape}) (at {location})")]
    IndexOutOfRange {
        /// The op.
        op: &'static str,
        /// The offending index.
        index: usize,
        /// The size of the indexed dimension.
        len: usize,
        /// The indexed operand's shape.
        shape: Shape,
        /// Caller's location.
        location: Loc,
    },
    /// A buffer's length does not match the shape it is given.
    #[error("{op}: {len} elements cannot have shape {shape} ({numel} elements) (at {location})", numel = shape.numel())]
    DataLength {
        /// The op.
        op: &'static str,
        /// Length of the data.
        len: usize,
        /// Requested shape.
        shape: Shape,
        /// Caller's location.
        location: Loc,
    },
    /// An op that needs exactly one element got more or fewer.
    #[error("{op}: needs a tensor with exactly one element, got shape {shape} (reduce it with sum or mean first) (at {location})")]
    NotScalar {
        /// The op.
        op: &'static str,
        /// The operand's shape.
        shape: Shape,
        /// Caller's location.
        location: Loc,
    },
    /// A backward pass from a value that no gradient-requesting leaf reaches (PyTorch:
    /// "element 0 of tensors does not require grad").
    #[error("{op}: the loss (shape {shape}) does not depend on any gradient-requesting leaf, so no gradient would be computed; mark inputs with Scope::leaf or Scope::param, and record the loss outside no_grad (at {location})")]
    NoGradient {
        /// The op (`backward`, `backward_into`, ...).
        op: &'static str,
        /// The loss's shape.
        shape: Shape,
        /// Caller's location.
        location: Loc,
    },
    /// The seed of [`Scope::backward_with`](crate::Scope::backward_with) does not have the
    /// output's shape.
    #[error("{op}: the seed gradient holds {len} elements but the output has shape {shape} (at {location})")]
    SeedLength {
        /// The op.
        op: &'static str,
        /// Elements in the seed.
        len: usize,
        /// The output's shape.
        shape: Shape,
        /// Caller's location.
        location: Loc,
    },
    /// A second backward over a tape that the first one consumed.
    #[error("backward: this tape was already consumed by a backward pass; record the graph again in a new scope, or use backward_retain for the first pass (at {location})")]
    BackwardTwice {
        /// Caller's location.
        location: Loc,
    },
    /// A recorded gradient ([`Scope::grad`](crate::Scope::grad)) through a custom op
    /// that provides no recorded derivative ([`CustomOp::grad`](crate::CustomOp::grad)).
    /// Every built-in op has one.
    #[error("{op}: a recorded (differentiable) gradient through custom op `{custom}` (input shapes {inputs}) needs CustomOp::grad, which the op does not provide; the fast backward still works (at {location})", inputs = list(inputs))]
    SecondOrderUnsupported {
        /// The method that walked the tape (`grad`, `vjp`, ...).
        op: &'static str,
        /// The custom op's name.
        custom: &'static str,
        /// Its inputs' shapes.
        inputs: Vec<Shape>,
        /// Caller's location.
        location: Loc,
    },
    /// A tangent (forward mode, [`Scope::forward`](crate::Scope::forward)) reached a custom
    /// op that provides no forward rule ([`CustomOp::jvp`](crate::CustomOp::jvp)). Every
    /// built-in op has one.
    #[error("{op}: a tangent (forward mode) through custom op `{custom}` (input shapes {inputs}) needs CustomOp::jvp, which the op does not provide (op recorded at {location})", inputs = list(inputs))]
    ForwardUnsupported {
        /// The transform (`jvp`).
        op: &'static str,
        /// The custom op's name.
        custom: &'static str,
        /// Its inputs' shapes.
        inputs: Vec<Shape>,
        /// Where the custom op was recorded.
        location: Loc,
    },
    /// The per-example transform ([`Scope::per_example`](crate::Scope::per_example)) met a
    /// program it cannot split into examples: an op that combines examples before the loss
    /// (a reduction, softmax or product over the batch axis), a parameter used by an op
    /// with no per-example rule, or a term of the loss that depends on no example.
    #[error("per_example: {detail}: op `{culprit}` (input shapes {inputs}) (at {location})", inputs = list(inputs))]
    PerExampleUnsupported {
        /// The op that cannot be split (the transform itself is `per_example`).
        culprit: &'static str,
        /// Its inputs' shapes.
        inputs: Vec<Shape>,
        /// What goes wrong, and what is supported instead.
        detail: String,
        /// Caller's location.
        location: Loc,
    },
    /// The arena's byte limit would be exceeded.
    #[error(
        "{op}: arena limit reached: requested {requested} bytes with {in_use} in use, limit {limit} (at {location})"
    )]
    ArenaLimit {
        /// The op that needed memory.
        op: &'static str,
        /// Bytes requested.
        requested: usize,
        /// Bytes in use before the request.
        in_use: usize,
        /// The configured limit.
        limit: usize,
        /// Caller's location.
        location: Loc,
    },
    /// The system allocator refused memory for the arena.
    #[error("{op}: out of memory allocating {requested} bytes for the arena (at {location})")]
    OutOfMemory {
        /// The op that needed memory.
        op: &'static str,
        /// Bytes requested.
        requested: usize,
        /// Caller's location.
        location: Loc,
    },
    /// The system allocator refused memory for an owned tensor, a parameter, a gradient
    /// buffer or an optimizer's state (everything outside the arena is allocated fallibly).
    #[error("{op}: out of memory allocating {requested} bytes for a tensor of shape {shape} (at {location})")]
    TensorOutOfMemory {
        /// The constructor or op that needed memory.
        op: &'static str,
        /// The shape of the tensor being allocated.
        shape: Shape,
        /// Bytes requested.
        requested: usize,
        /// Caller's location.
        location: Loc,
    },
    /// A parameter id, gradient buffer or optimizer used with a [`ParamStore`](crate::ParamStore)
    /// other than the one it was made for.
    #[error("{op}: {what} belongs to parameter store #{expected}, but was used with store #{found} (at {location})")]
    WrongStore {
        /// The op.
        op: &'static str,
        /// What was used with the wrong store (`"parameter #3"`, `"the gradient buffer"`).
        what: String,
        /// The store it was made for.
        expected: u64,
        /// The store it was used with.
        found: u64,
        /// Caller's location.
        location: Loc,
    },
    /// A structure of tensors given to a [`func::tree`](crate::func::tree) transform does
    /// not match the input's: a list of another length, a tensor of another shape, a
    /// gradient buffer of another parameter store.
    #[error("{op}: at {position}, {detail} (at {location})")]
    Structure {
        /// The transform.
        op: &'static str,
        /// Where in the structure, as a Rust path from the input: `input.1[3]`, `input.w`,
        /// `input["layer1.w"]`.
        position: String,
        /// What differs, with the shapes or lengths of both sides.
        detail: String,
        /// Caller's location.
        location: Loc,
    },
    /// More nodes than a `u32` can index.
    #[error("{op}: tape holds {len} nodes, the u32 limit; split the work into scopes (at {location})")]
    TapeFull {
        /// The op being recorded.
        op: &'static str,
        /// Nodes on the tape.
        len: usize,
        /// Caller's location.
        location: Loc,
    },
    /// Anomaly detection found a NaN or infinity.
    #[error("{op}: produced a non-finite value in the {phase} pass (shape {shape}) (recorded at {location})")]
    NonFinite {
        /// The op whose output (forward) or input gradient (backward) was not finite.
        op: &'static str,
        /// `"forward"` or `"backward"`.
        phase: &'static str,
        /// The shape of the offending tensor.
        shape: Shape,
        /// Where the op was recorded.
        location: Loc,
    },
    /// A scalar argument out of its domain (a negative slope is fine, a NaN bound is not).
    #[error("{op}: {detail} (at {location})")]
    InvalidArgument {
        /// The op.
        op: &'static str,
        /// What is wrong.
        detail: String,
        /// Caller's location.
        location: Loc,
    },
    /// A parameter id that does not belong to the store, or a gradient buffer of another store.
    #[error("{op}: {detail} (at {location})")]
    UnknownParam {
        /// The op.
        op: &'static str,
        /// What is wrong.
        detail: String,
        /// Caller's location.
        location: Loc,
    },
    /// A user-defined op ([`CustomOp`](crate::CustomOp)) panicked or reported a failure
    /// in one of its callbacks.
    #[error("{op}: the custom op's {phase} failed: {detail} (op recorded at {location})")]
    CustomOp {
        /// The op's own name ([`CustomOp::name`](crate::CustomOp::name)), or `"custom"` if
        /// that panicked.
        op: &'static str,
        /// The callback: `"name"`, `"output_shape"`, `"saved_len"`, `"forward"` or `"backward"`.
        phase: &'static str,
        /// Its message, or `panicked: ` and the panic's message.
        detail: String,
        /// Where the caller recorded the op (also for a failure in backward).
        location: Loc,
    },
    /// User code that the engine called while recording or differentiating (a checkpointed
    /// block, the random number generator of [`Scope::randn`](crate::Scope::randn))
    /// panicked. The scope keeps the error; the graph stays usable.
    #[error("{op}: {callback} panicked: {detail} (at {location})")]
    Callback {
        /// The method that called it (`"checkpoint"`, `"randn"`, `"backward"`, `"grad"`).
        op: &'static str,
        /// Which user code: `"the checkpointed block (part 0)"`, `"the random number generator"`.
        callback: String,
        /// The panic's message.
        detail: String,
        /// Where the caller recorded the call (the checkpoint, the draw).
        location: Loc,
    },
    /// Reading or writing a checkpoint failed.
    #[error("{op}: {detail}")]
    Io {
        /// The operation (`"save"`, `"load"`).
        op: &'static str,
        /// What went wrong, naming the tensor and shapes where relevant.
        detail: String,
    },
}

fn list(shapes: &[Shape]) -> String {
    let parts: Vec<String> = shapes.iter().map(ToString::to_string).collect();
    parts.join(", ")
}

/// What kind of mistake an [`Error`] reports, for bindings that map errors to their own
/// exception types (the Python package maps each to a `tapir.TapirError` subclass). Every
/// `Error` variant belongs to exactly one class; see [`Error::class`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// Shapes that do not fit the op, an axis out of range, data of the wrong length.
    Shape,
    /// An index out of range.
    Index,
    /// A backward pass that cannot run: no gradient path, a non-scalar loss, a consumed tape.
    Gradient,
    /// A derivative the engine does not have (a custom op without a recorded gradient).
    Unsupported,
    /// The arena's byte limit.
    ArenaLimit,
    /// An allocation that failed or could not be sized, or a full tape.
    Memory,
    /// A parameter of another store or an unknown one.
    Param,
    /// A NaN or an infinity found by anomaly detection.
    NonFinite,
    /// An argument out of its range.
    Argument,
    /// User code (a custom op, a checkpointed block, a generator) failed or panicked.
    Callback,
    /// Reading or writing a file or a byte buffer.
    Io,
}

impl Error {
    /// The class of this error (an exhaustive match: a new variant must choose one).
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::ShapeMismatch { .. }
            | Error::Broadcast { .. }
            | Error::MatMulShape { .. }
            | Error::BadAxis { .. }
            | Error::InvalidShape { .. }
            | Error::ShapeList { .. }
            | Error::DataLength { .. }
            | Error::Structure { .. } => ErrorClass::Shape,
            Error::IndexOutOfRange { .. } => ErrorClass::Index,
            Error::NotScalar { .. }
            | Error::NoGradient { .. }
            | Error::SeedLength { .. }
            | Error::BackwardTwice { .. } => ErrorClass::Gradient,
            Error::SecondOrderUnsupported { .. }
            | Error::ForwardUnsupported { .. }
            | Error::PerExampleUnsupported { .. } => ErrorClass::Unsupported,
            Error::ArenaLimit { .. } => ErrorClass::ArenaLimit,
            Error::OutOfMemory { .. } | Error::TensorOutOfMemory { .. } | Error::TapeFull { .. } => ErrorClass::Memory,
            Error::WrongStore { .. } | Error::UnknownParam { .. } => ErrorClass::Param,
            Error::NonFinite { .. } => ErrorClass::NonFinite,
            Error::InvalidArgument { .. } => ErrorClass::Argument,
            Error::CustomOp { .. } | Error::Callback { .. } => ErrorClass::Callback,
            Error::Io { .. } => ErrorClass::Io,
        }
    }

    /// The op named by this error (`"load"` and `"save"` for I/O).
    pub fn op(&self) -> &'static str {
        match self {
            Error::MatMulShape { .. } => "matmul",
            Error::BackwardTwice { .. } => "backward",
            Error::PerExampleUnsupported { .. } => "per_example",
            Error::ShapeMismatch { op, .. }
            | Error::Broadcast { op, .. }
            | Error::BadAxis { op, .. }
            | Error::InvalidShape { op, .. }
            | Error::ShapeList { op, .. }
            | Error::IndexOutOfRange { op, .. }
            | Error::DataLength { op, .. }
            | Error::NotScalar { op, .. }
            | Error::NoGradient { op, .. }
            | Error::SeedLength { op, .. }
            | Error::ArenaLimit { op, .. }
            | Error::OutOfMemory { op, .. }
            | Error::TensorOutOfMemory { op, .. }
            | Error::WrongStore { op, .. }
            | Error::Structure { op, .. }
            | Error::TapeFull { op, .. }
            | Error::NonFinite { op, .. }
            | Error::InvalidArgument { op, .. }
            | Error::UnknownParam { op, .. }
            | Error::CustomOp { op, .. }
            | Error::Callback { op, .. }
            | Error::SecondOrderUnsupported { op, .. }
            | Error::ForwardUnsupported { op, .. }
            | Error::Io { op, .. } => op,
        }
    }

    /// Where the caller was when the error arose, if it came from a call site.
    pub fn location(&self) -> Option<Loc> {
        match self {
            Error::Io { .. } => None,
            Error::MatMulShape { location, .. }
            | Error::BackwardTwice { location }
            | Error::ShapeMismatch { location, .. }
            | Error::Broadcast { location, .. }
            | Error::BadAxis { location, .. }
            | Error::InvalidShape { location, .. }
            | Error::ShapeList { location, .. }
            | Error::IndexOutOfRange { location, .. }
            | Error::DataLength { location, .. }
            | Error::NotScalar { location, .. }
            | Error::NoGradient { location, .. }
            | Error::SeedLength { location, .. }
            | Error::ArenaLimit { location, .. }
            | Error::OutOfMemory { location, .. }
            | Error::TensorOutOfMemory { location, .. }
            | Error::WrongStore { location, .. }
            | Error::Structure { location, .. }
            | Error::TapeFull { location, .. }
            | Error::NonFinite { location, .. }
            | Error::InvalidArgument { location, .. }
            | Error::UnknownParam { location, .. }
            | Error::CustomOp { location, .. }
            | Error::Callback { location, .. }
            | Error::SecondOrderUnsupported { location, .. }
            | Error::ForwardUnsupported { location, .. }
            | Error::PerExampleUnsupported { location, .. } => Some(location),
        }
    }
}

/// A vector of `n` copies of `v`, allocated fallibly: [`Error::TensorOutOfMemory`] naming
/// `op`, `shape` and `location` instead of aborting the process when the allocator refuses.
pub(crate) fn try_vec<T: Clone>(op: &'static str, shape: Shape, n: usize, v: T, location: Loc) -> Result<Vec<T>> {
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| Error::TensorOutOfMemory {
        op,
        shape,
        requested: n.saturating_mul(std::mem::size_of::<T>()),
        location,
    })?;
    out.resize(n, v);
    Ok(out)
}

/// A vector of `n` zeros, allocated fallibly and zeroed by the allocator
/// (`alloc_zeroed`: fresh pages come zeroed from the kernel, so nothing is written until
/// the caller writes); errors as [`try_vec`].
pub(crate) fn try_zeros<T: bytemuck::Pod>(op: &'static str, shape: Shape, n: usize, location: Loc) -> Result<Vec<T>> {
    bytemuck::allocation::try_zeroed_slice_box(n).map(Vec::from).map_err(|()| Error::TensorOutOfMemory {
        op,
        shape,
        requested: n.saturating_mul(std::mem::size_of::<T>()),
        location,
    })
}

/// Makes a [`Shape`] from dimensions, or the [`Error::InvalidShape`] that names `op`, the
/// input's shape and the caller's location.
#[track_caller]
pub(crate) fn shape_of(op: &'static str, input: Shape, dims: &[usize]) -> Result<Shape> {
    shape_at(op, input, dims, Location::caller())
}

/// [`shape_of`] with an explicit location (recording closures carry their caller's).
pub(crate) fn shape_at(op: &'static str, input: Shape, dims: &[usize], location: Loc) -> Result<Shape> {
    Shape::new(dims).map_err(|p| Error::InvalidShape {
        op,
        shape: input,
        detail: match p {
            crate::shape::ShapeProblem::Rank(r) => {
                format!("requested dimensions {dims:?} have rank {r}, above the maximum {}", crate::shape::MAX_RANK)
            }
            crate::shape::ShapeProblem::Overflow => {
                format!("requested dimensions {dims:?} overflow the element count")
            }
        },
        location,
    })
}
