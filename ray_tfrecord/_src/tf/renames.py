"""Keyword names the TensorFlow-facing API had before 0.2, mapped to Ray's ``to_tf`` names.

``tf_dataset``, ``ResumableFeed``, ``predict`` and ``inference`` took ``features=`` / ``label=``
(and ``tf_dataset`` ``drop_remainder=`` / ``ray_prefetch_batches=``); they now take Ray's
``feature_columns=`` / ``label_columns=`` / ``drop_last=`` / ``prefetch_batches=``. The old names
keep working until 0.2 with a ``FutureWarning``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

# Old name -> (the new argument's place in ``given``, its name, its default).
Table = Mapping[str, tuple[int, str, Any]]

COLUMNS: Table = {"features": (0, "feature_columns", None), "label": (1, "label_columns", None)}
FEATURES: Table = {"features": (0, "feature_columns", None)}


def renamed(function: str, table: Table, old: Mapping[str, Any], given: tuple[Any, ...], *,
            stacklevel: int = 3) -> tuple[Any, ...]:
    """``given`` (the new arguments' values) with any old-name keywords of ``old`` moved into place.

    Raises ``TypeError`` for an unknown keyword or an argument given under both names. ``stacklevel``:
    the warning's, counted from this function (3: the caller of the function that calls this).
    """
    values = list(given)
    for name, value in old.items():
        if name not in table:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")
        place, new, default = table[name]
        if values[place] != default:
            raise TypeError(f"{function}() got both {name}= and {new}=; pass {new}= only")
        warnings.warn(f"{function}({name}=) is deprecated and goes in 0.2: pass {new}= (Ray's to_tf name)",
                      FutureWarning, stacklevel=stacklevel)
        values[place] = value
    return tuple(values)
