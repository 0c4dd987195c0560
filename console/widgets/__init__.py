"""The console's widgets, one per module."""

from console.widgets.rank_grid import RankGrid
from console.widgets.status_header import StatusHeader
from console.widgets.throughput import ThroughputPanel
from console.widgets.timeline import Timeline

__all__ = ["RankGrid", "StatusHeader", "ThroughputPanel", "Timeline"]
