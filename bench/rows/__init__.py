"""The replicators under test, one module each, by row name."""

from bench.rows.base import Row, RowContext, RowOptions, RowUnavailableError, round_tag
from bench.rows.copyloop import CopyLoopRow
from bench.rows.ferryman import FerrymanRow
from bench.rows.mirrormaker import MirrorMakerEosRow, MirrorMakerRow

#: Row classes by name, in the default order of a run.
ROWS: dict[str, type[Row]] = {r.name: r for r in (FerrymanRow, CopyLoopRow, MirrorMakerRow, MirrorMakerEosRow)}

__all__ = ["ROWS", "Row", "RowContext", "RowOptions", "RowUnavailableError", "round_tag"]
