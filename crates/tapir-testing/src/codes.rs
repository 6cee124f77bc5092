//! The byte format of fuzz programs, and the code tables that keep every checked-in
//! corpus file decoding to the same program while ops are added.
//!
//! # Two formats
//!
//! An input that starts with [`FORMAT1_MAGIC`] (`b"TPv1"`) is in **format 1**; any other
//! input is in **format 0**. Both continue the same way (a header byte, the leaves, then
//! one step after another, see [`Program::from_bytes`](crate::program::Program::from_bytes));
//! they differ only in how a step's op is chosen.
//!
//! - **Format 0** is the format of every corpus file written before these tables
//!   existed, and is frozen: one byte `b` picks a step kind from [`KINDS0`] (the kind
//!   numbered `b % 32`), or from [`SMOOTH_KINDS0`] in smooth programs, and kinds that
//!   cover several ops (binary, comparison, scalar, unary, reduction, window) read a
//!   second byte indexing their own frozen 256-entry table ([`BINARY0`], ...). These
//!   tables reproduce exactly the `byte % n` choices of the original generator, for all
//!   256 byte values, and never change: every code is taken, so format 0 has no room
//!   for a new op, and a new op never appears in it.
//! - **Format 1** has room. One byte indexes [`FORMAT1`], a fixed 256-entry table in
//!   which every assigned code names one op completely (`0x02` is `mul`, `0x81` is
//!   `exp`): no op list is ever indexed modulo its length. An unassigned code decodes to
//!   [`Step::Nop`](crate::program::Step::Nop), which records nothing. In a smooth program
//!   a code of an op that is not smooth also decodes to `Nop`.
//!
//! # Adding an op
//!
//! Give it the next free code of its family in format 1 and change nothing else: a unary
//! op is one line in the `unary_ops!` table of `program/step.rs` (variant, code,
//! smoothness, how it is recorded); any other op is a [`Code`] variant, one line in
//! [`FORMAT1_CODES`], its arm in the generator and the interpreter, and its rule in the
//! shape model. No existing input decodes differently, except a format-1 input that
//! used the code while it was unassigned (its `Nop` becomes the op): the corpus
//! manifest test names such a file. Never reuse or move a code.
//!
//! Code ranges in format 1: `0x00–0x0f` binary ops, `0x10–0x17` comparisons, `0x18–0x2f`
//! scalar-operand ops, `0x30–0x4f` shape, selection, loss and gradient-control ops,
//! `0x50–0x57` reductions, `0x58–0x5f` window ops, `0x60–0x7f` adversarial step kinds,
//! attention (`0x62`, `0x63`) and the misbehaving custom op (`0x65`),
//! `0x80–0xbf` unary ops, `0xc0–0xff` free.
//!
//! The fuzzer reaches format 1 by itself (libFuzzer sees the comparison with the magic,
//! and `fuzz/tape_program.dict` lists it), and the property tests draw both formats.

use crate::program::{BinOp, CmpOp, ReduceOp, ScalarOp, UnaryOp, WindowOp};

/// The first bytes of a format-1 input. No format-0 corpus file starts with them (the
/// corpus manifest test would show the file decoding differently).
pub const FORMAT1_MAGIC: [u8; 4] = *b"TPv1";

/// How an input's ops are coded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The frozen format of the first corpus: kind `byte % 32`, then sub-tables.
    Legacy,
    /// One byte, one op, from [`FORMAT1`].
    V1,
}

/// The format of `bytes` and the bytes after the magic.
pub fn split_format(bytes: &[u8]) -> (Format, &[u8]) {
    match bytes.strip_prefix(&FORMAT1_MAGIC[..]) {
        Some(rest) => (Format::V1, rest),
        None => (Format::Legacy, bytes),
    }
}

/// An op the generator can produce, with everything that selects it (what a code of
/// [`FORMAT1`] names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // each variant is the step of the same name
pub enum Code {
    /// No op: an unassigned code.
    Nop,
    Binary(BinOp),
    Compare(CmpOp),
    Scalar(ScalarOp),
    Clamp,
    Unary(UnaryOp),
    MatMul,
    Reshape,
    Permute,
    Transpose,
    BroadcastTo,
    Squeeze,
    Unsqueeze,
    Narrow,
    Concat,
    Stack,
    IndexSelect,
    Where,
    Reduce(ReduceOp),
    Var,
    LogSumExp,
    Softmax,
    CrossEntropy,
    Nll,
    Bce,
    Mse,
    Detach,
    WithGrad,
    NoGrad,
    Const,
    Full,
    Conv2d,
    Window(WindowOp),
    /// A tensor with a zero dimension and huge ones (`[0, 2^31, 2^31]`), then a
    /// reduction, shape op or product of it.
    ZeroHuge,
    /// A reduction over an axis list that names one axis twice (`[1, 1]`, `[0, -2]`).
    RepeatedAxes,
    PadAxis,
    ScatterAdd,
    Linear,
    LayerNorm,
    AttentionWeights,
    Attend,
    /// The custom op of `program/custom.rs`, misbehaving in its backward as the next two
    /// bytes say (well-behaved in smooth programs).
    Custom,
}

impl Code {
    /// Whether a smooth program (valid arguments, differentiable ops, gradient-checked)
    /// may use the op: the kinds and sub-ops that format 0 draws in smooth programs.
    pub fn smooth(self) -> bool {
        match self {
            Code::Binary(op) => matches!(op, BinOp::Add | BinOp::Sub | BinOp::Mul),
            Code::Scalar(op) => matches!(op, ScalarOp::Add | ScalarOp::Sub | ScalarOp::Mul | ScalarOp::Div),
            Code::Unary(op) => op.smooth(),
            Code::Reduce(op) => matches!(op, ReduceOp::Sum | ReduceOp::Mean),
            Code::Window(op) => op != WindowOp::MaxPool2d,
            Code::MatMul
            | Code::Reshape
            | Code::Permute
            | Code::Transpose
            | Code::BroadcastTo
            | Code::Squeeze
            | Code::Unsqueeze
            | Code::Narrow
            | Code::Concat
            | Code::Stack
            | Code::IndexSelect
            | Code::PadAxis
            | Code::ScatterAdd
            | Code::Linear
            | Code::LayerNorm
            | Code::AttentionWeights
            | Code::Attend
            | Code::Custom
            | Code::Var
            | Code::LogSumExp
            | Code::Softmax
            | Code::CrossEntropy
            | Code::Nll
            | Code::Bce
            | Code::Mse
            | Code::Conv2d => true,
            Code::Nop
            | Code::Compare(_)
            | Code::Clamp
            | Code::Where
            | Code::Detach
            | Code::WithGrad
            | Code::NoGrad
            | Code::Const
            | Code::Full
            | Code::ZeroHuge
            | Code::RepeatedAxes => false,
        }
    }
}

/// The step kinds of format 0, in code order: `KIND_ORDER[b % 32]` is what byte `b` chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // each variant is the step of the same name
pub enum Kind {
    Binary,
    Compare,
    Scalar,
    Clamp,
    Unary,
    MatMul,
    Reshape,
    Permute,
    Transpose,
    BroadcastTo,
    Squeeze,
    Unsqueeze,
    Narrow,
    Concat,
    Stack,
    IndexSelect,
    Where,
    Reduce,
    Var,
    LogSumExp,
    Softmax,
    CrossEntropy,
    Nll,
    Bce,
    Mse,
    Detach,
    WithGrad,
    NoGrad,
    Const,
    Full,
    Conv2d,
    Window,
}

/// Format 0's 32 kinds, in the order of their codes.
const KIND_ORDER: [Kind; 32] = [
    Kind::Binary,
    Kind::Compare,
    Kind::Scalar,
    Kind::Clamp,
    Kind::Unary,
    Kind::MatMul,
    Kind::Reshape,
    Kind::Permute,
    Kind::Transpose,
    Kind::BroadcastTo,
    Kind::Squeeze,
    Kind::Unsqueeze,
    Kind::Narrow,
    Kind::Concat,
    Kind::Stack,
    Kind::IndexSelect,
    Kind::Where,
    Kind::Reduce,
    Kind::Var,
    Kind::LogSumExp,
    Kind::Softmax,
    Kind::CrossEntropy,
    Kind::Nll,
    Kind::Bce,
    Kind::Mse,
    Kind::Detach,
    Kind::WithGrad,
    Kind::NoGrad,
    Kind::Const,
    Kind::Full,
    Kind::Conv2d,
    Kind::Window,
];

/// The kinds format 0 draws in smooth programs, in the order of their codes.
const SMOOTH_KIND_ORDER: [Kind; 24] = [
    Kind::Binary,
    Kind::Scalar,
    Kind::Unary,
    Kind::MatMul,
    Kind::Reshape,
    Kind::Permute,
    Kind::Transpose,
    Kind::BroadcastTo,
    Kind::Squeeze,
    Kind::Unsqueeze,
    Kind::Narrow,
    Kind::Concat,
    Kind::Stack,
    Kind::IndexSelect,
    Kind::Reduce,
    Kind::Var,
    Kind::LogSumExp,
    Kind::Softmax,
    Kind::CrossEntropy,
    Kind::Nll,
    Kind::Bce,
    Kind::Mse,
    Kind::Conv2d,
    Kind::Window,
];

/// Format 0's binary ops, in code order (smooth programs use the first three).
const BINARY_ORDER: [BinOp; 7] =
    [BinOp::Add, BinOp::Sub, BinOp::Mul, BinOp::Div, BinOp::Pow, BinOp::Maximum, BinOp::Minimum];
/// Format 0's comparisons.
const CMP_ORDER: [CmpOp; 5] = [CmpOp::Gt, CmpOp::Ge, CmpOp::Lt, CmpOp::Le, CmpOp::Equal];
/// Format 0's scalar-operand ops (smooth programs use the first four).
const SCALAR_ORDER: [ScalarOp; 8] = [
    ScalarOp::Add,
    ScalarOp::Sub,
    ScalarOp::Mul,
    ScalarOp::Div,
    ScalarOp::Powf,
    ScalarOp::LeakyRelu,
    ScalarOp::RSub,
    ScalarOp::RDiv,
];
/// Format 0's unary ops: the first 15 of [`UnaryOp::ALL`], frozen here.
const UNARY_ORDER: [UnaryOp; 15] = [
    UnaryOp::Neg,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Sqrt,
    UnaryOp::Square,
    UnaryOp::Recip,
    UnaryOp::Abs,
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Relu,
    UnaryOp::Gelu,
    UnaryOp::GeluTanh,
    UnaryOp::Softplus,
];
/// Format 0's reductions (smooth programs use the first two).
const REDUCE_ORDER: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min];
/// Format 0's window ops (smooth programs use the first two).
const WINDOW_ORDER: [WindowOp; 3] = [WindowOp::AvgPool2d, WindowOp::Im2Col, WindowOp::MaxPool2d];

/// The 256-entry table that picks `list[b % n]` from the first `n` entries of `list`.
macro_rules! cycle {
    ($list:expr, $n:expr) => {{
        let list = $list;
        let mut out = [list[0]; 256];
        let mut i = 0;
        while i < 256 {
            out[i] = list[i % $n];
            i += 1;
        }
        out
    }};
}

/// Format 0: the kind byte `b` picks `KINDS0[b]`.
pub const KINDS0: [Kind; 256] = cycle!(KIND_ORDER, 32);
/// Format 0, smooth programs: the kind byte `b` picks `SMOOTH_KINDS0[b]`.
pub const SMOOTH_KINDS0: [Kind; 256] = cycle!(SMOOTH_KIND_ORDER, 24);
/// Format 0: the binary op byte.
pub const BINARY0: [BinOp; 256] = cycle!(BINARY_ORDER, 7);
/// Format 0, smooth programs: the binary op byte.
pub const SMOOTH_BINARY0: [BinOp; 256] = cycle!(BINARY_ORDER, 3);
/// Format 0: the comparison byte.
pub const CMP0: [CmpOp; 256] = cycle!(CMP_ORDER, 5);
/// Format 0: the scalar-operand op byte.
pub const SCALAR0: [ScalarOp; 256] = cycle!(SCALAR_ORDER, 8);
/// Format 0, smooth programs: the scalar-operand op byte.
pub const SMOOTH_SCALAR0: [ScalarOp; 256] = cycle!(SCALAR_ORDER, 4);
/// Format 0: the unary op byte (smooth programs read bytes until a smooth op comes up).
pub const UNARY0: [UnaryOp; 256] = cycle!(UNARY_ORDER, 15);
/// Format 0: the reduction byte.
pub const REDUCE0: [ReduceOp; 256] = cycle!(REDUCE_ORDER, 4);
/// Format 0, smooth programs: the reduction byte.
pub const SMOOTH_REDUCE0: [ReduceOp; 256] = cycle!(REDUCE_ORDER, 2);
/// Format 0: the window op byte.
pub const WINDOW0: [WindowOp; 256] = cycle!(WINDOW_ORDER, 3);
/// Format 0, smooth programs: the window op byte.
pub const SMOOTH_WINDOW0: [WindowOp; 256] = cycle!(WINDOW_ORDER, 2);

/// Format 1's assigned codes besides the unary ops (which carry theirs, see
/// [`UnaryOp::code`]). Append; never reuse or move a code.
pub const FORMAT1_CODES: &[(u8, Code)] = &[
    (0x00, Code::Binary(BinOp::Add)),
    (0x01, Code::Binary(BinOp::Sub)),
    (0x02, Code::Binary(BinOp::Mul)),
    (0x03, Code::Binary(BinOp::Div)),
    (0x04, Code::Binary(BinOp::Pow)),
    (0x05, Code::Binary(BinOp::Maximum)),
    (0x06, Code::Binary(BinOp::Minimum)),
    (0x10, Code::Compare(CmpOp::Gt)),
    (0x11, Code::Compare(CmpOp::Ge)),
    (0x12, Code::Compare(CmpOp::Lt)),
    (0x13, Code::Compare(CmpOp::Le)),
    (0x14, Code::Compare(CmpOp::Equal)),
    (0x18, Code::Scalar(ScalarOp::Add)),
    (0x19, Code::Scalar(ScalarOp::Sub)),
    (0x1a, Code::Scalar(ScalarOp::Mul)),
    (0x1b, Code::Scalar(ScalarOp::Div)),
    (0x1c, Code::Scalar(ScalarOp::Powf)),
    (0x1d, Code::Scalar(ScalarOp::LeakyRelu)),
    (0x1e, Code::Scalar(ScalarOp::RSub)),
    (0x1f, Code::Scalar(ScalarOp::RDiv)),
    (0x20, Code::Clamp),
    (0x30, Code::MatMul),
    (0x31, Code::Reshape),
    (0x32, Code::Permute),
    (0x33, Code::Transpose),
    (0x34, Code::BroadcastTo),
    (0x35, Code::Squeeze),
    (0x36, Code::Unsqueeze),
    (0x37, Code::Narrow),
    (0x38, Code::Concat),
    (0x39, Code::Stack),
    (0x3a, Code::IndexSelect),
    (0x3b, Code::Where),
    (0x3c, Code::Var),
    (0x3d, Code::LogSumExp),
    (0x3e, Code::Softmax),
    (0x3f, Code::CrossEntropy),
    (0x40, Code::Nll),
    (0x41, Code::Bce),
    (0x42, Code::Mse),
    (0x43, Code::Detach),
    (0x44, Code::WithGrad),
    (0x45, Code::NoGrad),
    (0x46, Code::Const),
    (0x47, Code::Full),
    (0x48, Code::Conv2d),
    (0x4a, Code::LayerNorm),
    (0x4b, Code::PadAxis),
    (0x4c, Code::ScatterAdd),
    (0x4f, Code::Linear),
    (0x50, Code::Reduce(ReduceOp::Sum)),
    (0x51, Code::Reduce(ReduceOp::Mean)),
    (0x52, Code::Reduce(ReduceOp::Max)),
    (0x53, Code::Reduce(ReduceOp::Min)),
    (0x58, Code::Window(WindowOp::Im2Col)),
    (0x59, Code::Window(WindowOp::MaxPool2d)),
    (0x5a, Code::Window(WindowOp::AvgPool2d)),
    (0x60, Code::ZeroHuge),
    (0x61, Code::RepeatedAxes),
    // Attention, here because the shape and loss family's free codes (0x49, 0x4d, 0x4e)
    // occur as `Nop` in regression seeds, which would then decode to other programs.
    (0x62, Code::AttentionWeights),
    (0x63, Code::Attend),
    // Not 0x64, which `regression-empty-sum-axes-order` holds as a `Nop`.
    (0x65, Code::Custom),
];

const fn format1() -> [Code; 256] {
    let mut table = [Code::Nop; 256];
    let mut i = 0;
    while i < FORMAT1_CODES.len() {
        let (code, op) = FORMAT1_CODES[i];
        assert!(matches!(table[code as usize], Code::Nop), "a format-1 code is assigned twice");
        table[code as usize] = op;
        i += 1;
    }
    let mut j = 0;
    while j < UnaryOp::ALL.len() {
        let op = UnaryOp::ALL[j];
        assert!(matches!(table[op.code() as usize], Code::Nop), "a unary op's code is already taken");
        table[op.code() as usize] = Code::Unary(op);
        j += 1;
    }
    table
}

/// Format 1: the code byte `b` names `FORMAT1[b]`; checked at compile time to give each
/// code at most one op.
pub const FORMAT1: [Code; 256] = format1();

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::run_program;

    #[test]
    fn format0_tables_are_the_original_modulo_choices() {
        for b in 0..256 {
            assert_eq!(KINDS0[b], KIND_ORDER[b % 32]);
            assert_eq!(SMOOTH_KINDS0[b], SMOOTH_KIND_ORDER[b % 24]);
            assert_eq!(UNARY0[b], UnaryOp::ALL[b % 15]);
            assert_eq!(WINDOW0[b], WINDOW_ORDER[b % 3]);
        }
    }

    #[test]
    fn format1_names_every_op_once() {
        let assigned: Vec<Code> = FORMAT1.iter().copied().filter(|&c| c != Code::Nop).collect();
        assert_eq!(assigned.len(), FORMAT1_CODES.len() + UnaryOp::ALL.len());
        for op in UnaryOp::ALL {
            assert_eq!(FORMAT1[usize::from(op.code())], Code::Unary(*op));
        }
        for b in BINARY_ORDER {
            assert!(FORMAT1.contains(&Code::Binary(b)), "{b:?}");
        }
        for k in [Kind::Compare, Kind::Scalar, Kind::Reduce, Kind::Window] {
            assert!(KINDS0.contains(&k));
        }
        assert_eq!(split_format(b"TPv1\x01"), (Format::V1, &[1u8][..]));
        assert_eq!(split_format(b"TPv"), (Format::Legacy, &b"TPv"[..]));
    }

    #[test]
    fn every_short_format1_input_runs_clean() {
        for len in 0..4 {
            for seed in 0..=255u8 {
                let body = (0..len * 16).map(|i| seed.wrapping_mul(29).wrapping_add((i as u8).wrapping_mul(11)));
                let bytes: Vec<u8> = FORMAT1_MAGIC.iter().copied().chain(body).collect();
                if let Err(f) = run_program(&bytes) {
                    panic!("{f}");
                }
            }
        }
    }
}
