//! A user-defined op in random programs (format-1 code `0x65`, [`Step::Custom`]), whose
//! backward misbehaves as the generator chose: the hardening class "custom ops" of issue
//! 31 as a generator.
//!
//! The op is `y = x₀ + Σₖ (k+1)·Σ xₖ` over one to three operands of any shapes (`y` has
//! `x₀`'s shape; an operand may be given twice). Its backward first adds the right
//! gradients into the slots it is given, `dx₀ += dout` and `dxₖ += (k+1)·Σ dout` for
//! `k ≥ 1` (the weights tell the inputs apart, so a swapped slot changes the gradients),
//! then does what its [`Misbehave`] says: nothing, return an error, panic, or hand back
//! other slots than it was given (shorter, dropped, swapped, moved into another input's
//! place, split in two). Its recorded derivative ([`CustomOp::grad`]) and its forward rule
//! ([`CustomOp::jvp`]) are always right, so a well-behaved one is gradient-checked to second
//! order and tangent-checked in smooth programs.
//!
//! The checker (`check.rs`, `buffer.rs`) holds the engine to: a misbehaving backward is
//! either harmless (it handed back exactly the slots it was given, which [`Misbehave::effective`]
//! decides from the inputs alone) and gives the well-behaved op's bits, or it is
//! [`tapir::Error::CustomOp`] naming [`NAME`] and the phase `backward`; nothing panics; and
//! `backward_into` leaves the caller's buffer unchanged on error.
//!
//! [`Step::Custom`]: crate::program::Step::Custom

use std::cell::Cell;
use std::sync::Once;

use tapir::{CustomError, CustomInputs, CustomOp, Float, Shape, Var};

/// The op's name, which its errors must carry.
pub const NAME: &str = "fuzz_custom";

/// Most operands of one custom step.
pub const MAX_INPUTS: usize = 3;

/// What the op's backward does after adding the right gradients. Slot indices are taken
/// modulo the number of inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Misbehave {
    /// Nothing: a well-behaved op.
    Not,
    /// Returns `CustomError::Failed`.
    Fail,
    /// Panics.
    Panic,
    /// Hands back slot `k` one element shorter (an empty one as it was).
    Shorter(u8),
    /// Sets slot `k` to `None`.
    Drop(u8),
    /// Swaps slots `j` and `k`.
    Swap(u8, u8),
    /// Moves slot `j` into slot `k`, leaving `j` empty.
    Move(u8, u8),
    /// Splits slot `j` in two halves: the first stays, the second goes to slot `k`.
    Split(u8, u8),
}

/// Every [`Misbehave`] with indices below [`MAX_INPUTS`]: the op's instances live here,
/// since a recorded op is borrowed for longer than any one program.
static ALL: [Misbehave; 3 + 2 * MAX_INPUTS + 3 * MAX_INPUTS * MAX_INPUTS] = all();

const fn all() -> [Misbehave; 3 + 2 * MAX_INPUTS + 3 * MAX_INPUTS * MAX_INPUTS] {
    let mut out = [Misbehave::Not; 3 + 2 * MAX_INPUTS + 3 * MAX_INPUTS * MAX_INPUTS];
    out[1] = Misbehave::Fail;
    out[2] = Misbehave::Panic;
    let mut i = 3;
    let mut k = 0;
    while k < MAX_INPUTS {
        out[i] = Misbehave::Shorter(k as u8);
        out[i + 1] = Misbehave::Drop(k as u8);
        i += 2;
        let mut j = 0;
        while j < MAX_INPUTS {
            out[i] = Misbehave::Swap(j as u8, k as u8);
            out[i + 1] = Misbehave::Move(j as u8, k as u8);
            out[i + 2] = Misbehave::Split(j as u8, k as u8);
            i += 3;
            j += 1;
        }
        k += 1;
    }
    out
}

impl Misbehave {
    /// The mode that a kind byte and an index byte select for an op of `n` inputs (`1 ≤ n
    /// ≤ 3`): kind `kind % 8` in the order of the variants, `j = index % n`, `k = (index /
    /// 4) % n`. Frozen, as format 1's codes are: a corpus file must keep its meaning.
    pub fn decode(kind: u8, index: u8, n: usize) -> Misbehave {
        let n = n.clamp(1, MAX_INPUTS);
        let (j, k) = ((usize::from(index) % n) as u8, (usize::from(index / 4) % n) as u8);
        match kind % 8 {
            0 => Misbehave::Not,
            1 => Misbehave::Fail,
            2 => Misbehave::Panic,
            3 => Misbehave::Shorter(k),
            4 => Misbehave::Drop(k),
            5 => Misbehave::Swap(j, k),
            6 => Misbehave::Move(j, k),
            _ => Misbehave::Split(j, k),
        }
    }

    /// The op that misbehaves so, borrowed for as long as any scope.
    pub(crate) fn op(self) -> &'static Misbehave {
        ALL.iter().find(|&&m| m == self).expect("the generator draws indices below MAX_INPUTS")
    }

    /// Whether the op must fail if its backward runs, given each input's slot: `Some(len)`
    /// for an input that requires a gradient (the engine hands it a slot of its element
    /// count), `None` otherwise. A reshuffle that hands back the very slots it was given
    /// (a `Drop` of a `None`, a `Swap` of a slot with itself) is harmless.
    pub fn effective(self, slots: &[Option<usize>]) -> bool {
        if matches!(self, Misbehave::Fail | Misbehave::Panic) {
            return true;
        }
        let given: Vec<Option<Token>> =
            slots.iter().enumerate().map(|(input, s)| s.map(|len| Token { input, start: 0, len })).collect();
        let mut got = given.clone();
        self.reshuffle(&mut got);
        got != given
    }

    /// Rearranges the slots as the mode says (the slot modes only).
    fn reshuffle<S: Slot>(self, slots: &mut [Option<S>]) {
        let n = slots.len();
        if n == 0 {
            return;
        }
        let at = |i: u8| usize::from(i) % n;
        match self {
            Misbehave::Not | Misbehave::Fail | Misbehave::Panic => {}
            Misbehave::Shorter(k) => {
                if let Some(s) = slots[at(k)].take() {
                    let len = s.size();
                    slots[at(k)] = Some(if len == 0 { s } else { s.cut(len - 1).0 });
                }
            }
            Misbehave::Drop(k) => slots[at(k)] = None,
            Misbehave::Swap(j, k) => slots.swap(at(j), at(k)),
            Misbehave::Move(j, k) => {
                let s = slots[at(j)].take();
                slots[at(k)] = s;
            }
            Misbehave::Split(j, k) => {
                if let Some(s) = slots[at(j)].take() {
                    let len = s.size();
                    let (a, b) = s.cut(len / 2);
                    slots[at(j)] = Some(a);
                    slots[at(k)] = Some(b);
                }
            }
        }
    }
}

/// A gradient slot as [`Misbehave::reshuffle`] sees it: a buffer or, to predict what the
/// engine sees, a [`Token`] naming the part of an input's slot it is.
trait Slot: Sized {
    fn size(&self) -> usize;
    fn cut(self, mid: usize) -> (Self, Self);
}

impl<T> Slot for &mut [T] {
    fn size(&self) -> usize {
        self.len()
    }
    fn cut(self, mid: usize) -> (Self, Self) {
        self.split_at_mut(mid)
    }
}

/// Elements `start..start + len` of input `input`'s slot: what the engine compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Token {
    input: usize,
    start: usize,
    len: usize,
}

impl Slot for Token {
    fn size(&self) -> usize {
        self.len
    }
    fn cut(self, mid: usize) -> (Self, Self) {
        let rest = Token { input: self.input, start: self.start + mid, len: self.len - mid };
        (Token { len: mid, ..self }, rest)
    }
}

/// The weight of input `k` in the output.
fn weight<T: Float>(k: usize) -> T {
    T::from_f64(k as f64 + 1.0)
}

fn total<T: Float>(v: &[T]) -> T {
    v.iter().fold(T::ZERO, |a, &x| a + x)
}

thread_local! {
    /// Set just before the op panics on purpose, so that the hook stays quiet.
    static PANICKING: Cell<bool> = const { Cell::new(false) };
}

/// Panics on purpose. The first call wraps the process's panic hook so that this panic
/// is silent and, under cargo-fuzz, does not abort the process: libFuzzer's hook aborts
/// on every panic, including one the engine catches. Any other panic goes to the previous
/// hook as before.
fn panic_on_purpose() -> ! {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !PANICKING.with(|p| p.replace(false)) {
                previous(info);
            }
        }));
    });
    PANICKING.with(|p| p.set(true));
    panic!("{NAME}: told to panic in backward");
}

impl<T: Float> CustomOp<T> for Misbehave {
    fn name(&self) -> &'static str {
        NAME
    }

    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, CustomError> {
        inputs.first().copied().ok_or_else(|| CustomError::Failed("takes at least one input".into()))
    }

    fn forward(&self, x: CustomInputs<'_, T>, out: &mut [T], _: &mut [T]) -> Result<(), CustomError> {
        let extra = (1..x.len()).fold(T::ZERO, |a, k| a + weight::<T>(k) * total(x.value(k)));
        for (y, &v) in out.iter_mut().zip(x.value(0)) {
            *y = v + extra;
        }
        Ok(())
    }

    fn backward(
        &self,
        _: CustomInputs<'_, T>,
        _: &[T],
        _: &[T],
        dout: &[T],
        dx: &mut [Option<&mut [T]>],
    ) -> Result<(), CustomError> {
        let sum = total(dout);
        for (k, d) in dx.iter_mut().enumerate() {
            match d.as_deref_mut() {
                Some(d) if k == 0 => d.iter_mut().zip(dout).for_each(|(d, &g)| *d += g),
                Some(d) => {
                    let g = weight::<T>(k) * sum;
                    d.iter_mut().for_each(|d| *d += g);
                }
                None => {}
            }
        }
        match self {
            Misbehave::Fail => Err(CustomError::Failed("told to fail in backward".into())),
            Misbehave::Panic => panic_on_purpose(),
            _ => {
                self.reshuffle(dx);
                Ok(())
            }
        }
    }

    fn grad<'s>(
        &self,
        inputs: &[Var<'s, T>],
        _: Var<'s, T>,
        g: Var<'s, T>,
        dinputs: &mut [Option<Var<'s, T>>],
    ) -> bool {
        let sum = g.sum();
        for (k, (x, d)) in inputs.iter().zip(dinputs.iter_mut()).enumerate() {
            *d = Some(if k == 0 { g } else { sum.mul_scalar(weight(k)).broadcast_to(&x.shape().to_vec()) });
        }
        true
    }

    /// `ẏ = ẋ₀ + Σₖ (k+1)·Σ ẋₖ`: the op is linear, so its tangent is the op on the tangents.
    fn jvp<'s>(
        &self,
        inputs: &[Var<'s, T>],
        _: Var<'s, T>,
        tangents: &[Option<Var<'s, T>>],
        tangent: &mut Option<Var<'s, T>>,
    ) -> bool {
        let shape = inputs[0].shape().to_vec();
        for (k, t) in tangents.iter().enumerate() {
            let Some(t) = *t else { continue };
            let term = if k == 0 { t } else { t.sum().mul_scalar(weight(k)).broadcast_to(&shape) };
            *tangent = Some(match *tangent {
                Some(acc) => acc + term,
                None => term,
            });
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_has_an_instance_and_decodes() {
        for m in ALL {
            assert_eq!(*m.op(), m);
        }
        assert_eq!(Misbehave::decode(5, 0b0110, 3), Misbehave::Swap(0, 1));
        assert_eq!(Misbehave::decode(8, 0xff, 1), Misbehave::Not);
    }

    #[test]
    fn harmless_reshuffles_are_not_effective() {
        let slots = [Some(4), None, Some(0)];
        assert!(!Misbehave::Not.effective(&slots));
        assert!(Misbehave::Fail.effective(&slots));
        assert!(!Misbehave::Drop(1).effective(&slots));
        assert!(Misbehave::Drop(0).effective(&slots));
        assert!(!Misbehave::Swap(2, 2).effective(&slots));
        assert!(Misbehave::Swap(0, 2).effective(&slots));
        assert!(!Misbehave::Shorter(2).effective(&slots), "an empty slot cannot get shorter");
        assert!(Misbehave::Shorter(0).effective(&slots));
        assert!(!Misbehave::Move(1, 1).effective(&slots));
        assert!(Misbehave::Move(1, 0).effective(&slots), "moving a `None` over a slot drops it");
        // Splitting an empty slot leaves it as it was and fills another input's.
        assert!(Misbehave::Split(2, 1).effective(&slots));
        assert!(!Misbehave::Split(1, 0).effective(&slots), "a `None` has nothing to split");
    }
}
