"""What a Kineto load keeps of the events (memgate.loaders.kineto.kineto_events): exact µs to ns.

The shortcut for timestamps that plainly meet the schema (``plain_us_ns``) must give what the full
check (``check_column``, as ijson reads the values) and ``us_to_ns`` give, whichever reader read them.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from memgate.loaders.kineto import kineto_events
from memgate.readers.jsonstream import NumberText
from memgate.readers.pyrecords import check_column, resolve
from memgate.readers.traceevents import as_decimal
from memgate.schemas import load_schema

NUMBERS = st.from_regex(r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,12})?([eE][+-]?[0-9]{1,3})?", fullmatch=True)
US_TEXT = st.one_of(st.from_regex(r"(0|[1-9][0-9]{0,16})\.[0-9]{1,11}", fullmatch=True), NUMBERS,
                    st.sampled_from(["9000000000000000.000", "8999999999999999.9999", "9000000000000000.0001",
                                     "0.0", "-0.0", "1e3", "1E-3", "0.0005", "0.0004999999999"]))
KINETO_US = st.from_regex(r"(0|[1-9][0-9]{0,14})\.[0-9]{3}", fullmatch=True)  # below the 9e15 cap
SCHEMA = load_schema("kineto")
TS_PROP = resolve(SCHEMA["$defs"]["x_event"]["properties"]["ts"], SCHEMA)


@given(texts=st.lists(US_TEXT, min_size=1, max_size=6), ints=st.lists(st.integers(-5, 10**16), max_size=2),
       as_text=st.booleans())
@example(texts=["0E-20"], ints=[], as_text=False)  # arrow's bound check needed precision 39 and raised
@example(texts=["-1E-910"], ints=[], as_text=False)  # Arrow converts it to 0 without an error
def test_plain_us_ns_is_what_check_column_and_us_to_ns_give(texts: list[str], ints: list[int], as_text: bool) -> None:
    """Where the shortcut answers, check_column accepts the values (as ijson reads them) and us_to_ns
    converts them to the same ns (values near a bound, or odd ones, may take the long way)."""
    values: list[Any] = [NumberText(t) if as_text else Decimal(t) for t in texts] + ints
    got = kineto_events.plain_us_ns(values, TS_PROP)
    if got is not None:
        as_ijson = [as_decimal(v) for v in values]
        _, problem = check_column(as_ijson, TS_PROP, name="ts", where=str, required=True)
        assert problem is None
        assert got.tolist() == kineto_events.us_to_ns(as_ijson, 0).tolist()


@given(texts=st.lists(KINETO_US, min_size=1, max_size=6), as_text=st.booleans())
def test_plain_us_ns_answers_for_kineto_times(texts: list[str], as_text: bool) -> None:
    values = [NumberText(t) if as_text else Decimal(t) for t in texts]
    got = kineto_events.plain_us_ns(values, TS_PROP)
    assert got is not None and got.tolist() == [int(Decimal(t) * 1000) for t in texts]
