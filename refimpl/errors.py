"""The exceptions refimpl raises on bad input: one hierarchy, each class also the built-in type callers catch.

Layer: constants (imports nothing).  Every error a public function raises for bad input is an instance of
:class:`RefimplError` and of the built-in exception a caller would expect (``ValueError``, ``TypeError``,
``KeyError``), so ``except ValueError`` keeps working and ``except refimpl.errors.RefimplError`` catches
every refusal of the reference at once.  Messages name the argument (for parameters: the full state_dict key,
``blocks.3.attn.qkv.weight``), what was expected and what was given, and never print whole arrays
(shapes, dtypes and single values only).

=========================  ==============  ====================================================================
class                      built-in base   raised for
=========================  ==============  ====================================================================
``ArgumentError``          ValueError      an argument's value: out of range (eps < 0, NaN), wrong shape or rank,
                                           inconsistent sizes (N != H W), an unknown option
``ArgumentTypeError``      TypeError       an argument's type or dtype (a str where an array is expected, int or
                                           object arrays, a non-dict ``taps``)
``ParameterKeyError``      KeyError        a params mapping whose keys differ from the expected state_dict keys
                                           (missing, unexpected, misspelled: "did you mean")
``ParameterShapeError``    ValueError      a parameter of the wrong shape, reported with its full key
``ParameterTypeError``     TypeError       a parameter that is not a real floating array
``ParameterValueError``    ValueError      a parameter value the mathematics refuses (BatchNorm running_var < 0)
=========================  ==============  ====================================================================

``ParameterShapeError`` and ``ParameterValueError`` are ``ArgumentError``\\ s too (the parameter is part of
the ``params`` argument); ``ParameterTypeError`` is an ``ArgumentTypeError``.
"""

from __future__ import annotations

__all__ = ["RefimplError", "ArgumentError", "ArgumentTypeError", "ParameterError", "ParameterKeyError",
           "ParameterShapeError", "ParameterTypeError", "ParameterValueError"]


class RefimplError(Exception):
    """Base class of every bad-input error refimpl raises."""


class ArgumentError(RefimplError, ValueError):
    """An argument's value is refused (range, shape, rank, consistency, unknown option)."""


class ArgumentTypeError(RefimplError, TypeError):
    """An argument's type or dtype is refused."""


class ParameterError(RefimplError):
    """Base class of the errors about a params mapping (the state_dict-keyed weights)."""


class ParameterKeyError(ParameterError, KeyError):
    """The keys of a params mapping differ from the expected state_dict keys.

    ``KeyError.__str__`` quotes its argument (``"'missing ...'"``); this class prints its message as is."""

    def __str__(self) -> str:
        """The message as given (not quoted as ``KeyError.__str__`` would); more than one argument: KeyError's own
        text."""
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class ParameterShapeError(ParameterError, ArgumentError):
    """A parameter has the wrong shape (the message names the full key)."""


class ParameterTypeError(ParameterError, ArgumentTypeError):
    """A parameter is not a real floating array (the message names the full key)."""


class ParameterValueError(ParameterError, ArgumentError):
    """A parameter's values are outside what the mathematics allows (BatchNorm running_var < 0)."""
