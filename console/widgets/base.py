"""What every console widget needs to be cheap to refresh on every frame of a 1 kHz stream.

Under such a stream every widget's content changes on every frame, so what a refresh costs beyond the
widget's own lines is paid ten times a second (measured with cProfile, 64 ranks at 120x40):

- `Widget.refresh` empties Textual's cache of component styles: resolving the same few styles again cost
  about 2 ms a frame. `component_style` keeps them until the styles change (theme, focus, CSS).
- Refreshing a widget that is not on screen (the player bar of a live view, the side panel of a narrow
  terminal) makes Textual rebuild its whole map of the screen's widgets, about 1 ms a frame.
  `refresh_content` refreshes such a widget when it is shown again instead.
"""

from __future__ import annotations

from rich.style import Style
from textual.widget import Widget


class ConsoleWidget(Widget):
    """A widget whose component styles are cached and whose refresh waits while it is not on screen."""

    COMPONENT_PREFIX = ""

    def component_style(self, name: str) -> Style:
        """The partial rich style of the component class `<COMPONENT_PREFIX>--<name>`."""
        cache: dict[str, Style] | None = self.__dict__.get("_resolved_component_styles")
        if cache is None:
            cache = self.__dict__["_resolved_component_styles"] = {}
        style = cache.get(name)
        if style is None:
            style = self.get_component_rich_style(f"{self.COMPONENT_PREFIX}--{name}", partial=True)
            if self.is_mounted:  # before the stylesheet applies, a style is not yet the one to keep
                cache[name] = style
        return style

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self.__dict__.pop("_resolved_component_styles", None)

    def refresh_content(self) -> None:
        """Repaint for new content: now when on screen, else when next shown."""
        if self.is_on_screen:
            self.refresh()
        else:
            self.__dict__["_refresh_when_shown"] = True

    def on_show(self) -> None:
        if self.__dict__.pop("_refresh_when_shown", False):
            self.refresh()
