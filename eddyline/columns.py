"""Reserved column names: the internal columns every layer agrees on.

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
