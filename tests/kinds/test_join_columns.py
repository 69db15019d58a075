"""What a join keeps of its inputs when the steps after it read only some of its output
(``join_columns``): its keys and times, weights, the columns behind the names read, and every
output column keeps its name."""

from __future__ import annotations

from eddyline.columns import join_right_names
from eddyline.kinds.join import Join, join_columns

AUCTION = ["id", "item_name", "description", "date_time", "expires", "seller", "category", "extra"]
BID = ["auction", "bidder", "price", "channel", "url", "date_time", "extra"]
INTERVAL = Join(left="a", right="b", left_key="id", right_key="auction", kind="interval",
                left_time="date_time", left_end="expires", right_time="date_time")


def _outputs(left: list[str], right: list[str], keep: tuple[list[str], list[str]]) -> dict[str, str]:
    """Output name -> (side, input column) of the kept columns, as the kernel names them."""
    kl, kr = keep
    out = {n: f"l.{n}" for n in kl}
    out.update({o: f"r.{n}" for n, o in zip(kr, join_right_names(kl, kr), strict=True)})
    return out


def test_the_read_columns_keys_and_times_stay_under_their_names():
    wanted = frozenset({"id", "category", "price", "bidder", "date_time_right"})
    keep = join_columns(AUCTION, BID, INTERVAL, wanted)
    assert keep == (["id", "date_time", "expires", "category"], ["auction", "bidder", "price", "date_time"])
    full = _outputs(AUCTION, BID, (AUCTION, BID))
    cut = _outputs(AUCTION, BID, keep)
    assert all(full[name] == source for name, source in cut.items())  # no output column renamed
    assert {"id", "category", "price", "bidder", "date_time_right"} <= set(cut)


def test_a_right_column_read_under_its_suffixed_name_keeps_the_left_one_it_collides_with():
    j = Join(left="a", right="b", left_key="id", right_key="auction")  # unbounded: no times
    keep = join_columns(AUCTION, BID, j, frozenset({"extra_right"}))
    assert keep is not None
    assert "extra" in keep[0] and "extra" in keep[1]  # the left one keeps the right one's name
    assert _outputs(AUCTION, BID, keep)["extra_right"] == "r.extra"


def test_weights_stay_and_nothing_is_cut_when_all_is_read_or_needed():
    keep = join_columns([*AUCTION, "_diff"], [*BID, "_diff"], INTERVAL, frozenset({"price"}))
    assert keep is not None and "_diff" in keep[0] and "_diff" in keep[1]
    assert join_columns(AUCTION, BID, INTERVAL, None) is None
    assert join_columns(["id", "date_time", "expires"], ["auction", "date_time"], INTERVAL, frozenset()) is None
