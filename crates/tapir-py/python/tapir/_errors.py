"""Tapir's exceptions. Each derives from ``TapirError`` and from the matching built-in,
so ``except ValueError`` catches a ``ShapeError`` as it would NumPy's."""


class TapirError(Exception):
    """Base class of every error Tapir raises."""


class ScopeError(TapirError, RuntimeError):
    """A handle used after its scope ended, in another graph's scope or from another
    thread; a scope opened twice; parameters changed while a scope reads them."""


class DTypeError(TapirError, TypeError):
    """A value of the wrong dtype (one dtype per graph; float32 and float64 do not mix)."""


class ShapeError(TapirError, ValueError):
    """Shapes that do not fit the op, an axis out of range, data of the wrong length."""


class TapirIndexError(TapirError, IndexError):
    """An index out of range."""


class GradientError(TapirError, RuntimeError):
    """A backward pass that cannot run: a non-scalar loss, no path to a leaf, a tape
    already consumed."""


class UnsupportedError(TapirError, NotImplementedError):
    """A derivative the engine does not have."""


class ArenaLimitError(TapirError, MemoryError):
    """A scope passed its graph's arena byte limit."""


class TapirMemoryError(TapirError, MemoryError):
    """An allocation that failed or could not be sized, or a full tape."""


class ParamError(TapirError, KeyError):
    """A parameter that is not in the store, or of another store."""

    def __str__(self):  # KeyError would quote the message
        return Exception.__str__(self)


class NonFiniteError(TapirError, FloatingPointError):
    """A NaN or an infinity found by anomaly detection."""


class ArgumentError(TapirError, ValueError):
    """An argument out of its range."""


class CallbackError(TapirError, RuntimeError):
    """User code run by the engine failed."""


class TapirIOError(TapirError, OSError):
    """Reading or writing parameters failed."""
