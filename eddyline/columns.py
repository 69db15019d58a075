"""Reserved column names: the internal columns every layer agrees on, and how a join names its
right side's columns (the SQL front end predicts it, the join kernel does it).

User columns must not start with an underscore followed by these names; the runtime adds and
drops them around the kernels.
"""

#: A row's key group (int32): ``pmod(xxhash64(key columns), K)``, or a virtual key group
#: ``g + K * f`` for fragment ``f`` of a split (SPREADFIRE) group.
KG = "_kg"
#: A revision's weight (int64): +n inserts n copies of the row, -n takes n copies back (a Z-set,
#: see docs/revisions.md). A stream without it is insert-only: every row weighs +1.
DIFF = "_diff"
#: In a state delta file: 1 marks a deleted primary key (see eddyline.state.store).
OP = "_op"
#: Optional bool input column of split key groups: a probe copy of a row stored in another
#: fragment of the same key group (see eddyline.operators.join).
PROBE = "_probe"
#: Behind a shed point feeding a window aggregate: the weight (1 / keep fraction) of a kept row,
#: for the window's scaled estimates (see eddyline.kinds.window).
WEIGHT = "_w"


def join_right_names(left: list[str] | tuple[str, ...], right: list[str] | tuple[str, ...]) -> list[str]:
    """A join's output names for its right columns: a name the left side has gets ``_right``
    appended (again, until it is free)."""
    taken = set(left) | set(right)
    names = []
    for name in right:
        out = name
        if name in left:
            out = f"{name}_right"
            while out in taken:
                out = f"{out}_right"
            taken.add(out)
        names.append(out)
    return names
