"""The replicators under test, one module each, by row name."""

from bench.rows.base import Row, RowContext, RowOptions, RowUnavailableError, round_tag
from bench.rows.copyloop import CopyLoopRow
from bench.rows.ferryman import FerrymanOnePairRow, FerrymanRow
from bench.rows.ferryman_observed import (
    FerrymanBareRow,
    FerrymanTraced01Row,
    FerrymanTraced10Row,
    FerrymanTracedAllRow,
    FerrymanTracedDefaultRow,
    FerrymanTracedRow,
)
from bench.rows.mirrormaker import MirrorMakerEosRow, MirrorMakerRow

#: Row classes by name, in the default order of a run.
ROWS: dict[str, type[Row]] = {
    r.name: r
    for r in (
        FerrymanRow,
        CopyLoopRow,
        FerrymanOnePairRow,
        MirrorMakerRow,
        MirrorMakerEosRow,
        FerrymanBareRow,
        FerrymanTracedDefaultRow,
        FerrymanTraced01Row,
        FerrymanTracedRow,
        FerrymanTraced10Row,
        FerrymanTracedAllRow,
    )
}

#: The rows a run without --rows compares (the observability-cost rows are asked for by name).
DEFAULT_ROWS: tuple[str, ...] = ("ferryman", "copyloop", "mm2", "mm2-eos")

__all__ = ["DEFAULT_ROWS", "ROWS", "Row", "RowContext", "RowOptions", "RowUnavailableError", "round_tag"]
