"""The console's widgets, one per module."""

from console.widgets.alerts_panel import AlertsPanel
from console.widgets.heatmap import Heatmap
from console.widgets.player_bar import PlayerBar
from console.widgets.rank_grid import RankGrid
from console.widgets.status_header import StatusHeader
from console.widgets.summary_line import SummaryLine
from console.widgets.throughput import ThroughputPanel
from console.widgets.timeline import Timeline

__all__ = [
    "AlertsPanel", "Heatmap", "PlayerBar", "RankGrid", "StatusHeader", "SummaryLine", "ThroughputPanel", "Timeline",
]
