"""The explorers' one settings check, shared by the live and the static face.

Each explorer declares its settings once, as a dict {argument name: ``Choice`` or
``Range``}; both faces call ``check`` on the values a chapter passes before drawing
anything. A value outside its choices or range is a ValueError naming the argument as
the caller wrote it, the value and what is allowed. Nothing is clamped: a live slider
is built only from a value ``check`` accepted, and a static twin only looks up values
that are points of its grid (``index``), so neither face can quietly show another
setting than the one asked for.

A declaration is also the control: its ``label`` and widget kind (a ``Choice``'s
``widget``: a drop-down menu, a selection slider or a checkbox; a ``Range`` is a slider,
a log slider where ``log``) build the live face's ipywidget (``control``, ``controls``),
so a control's label, options and range are written once.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

#: A ``Choice``'s live widget kinds.
WIDGETS = ("menu", "slider", "checkbox")


@dataclass(frozen=True)
class Choice:
    """One of ``options`` (compared with ``==``; bools never stand in for numbers, nor
    floats for ints: 512.0 is not the option 512);
    ``shown`` lists them as a reader knows them where the options are encoded (the
    temperature slider's exponents shown as temperatures). The live control: ``label``,
    ``widget`` ("menu", "slider" or "checkbox") and ``names``, the text its menu or
    slider shows for each option (the options themselves where None)."""

    options: tuple
    shown: tuple | None = None
    label: str = ""
    widget: str = "menu"
    names: tuple | None = None

    def __init__(self, options, shown=None, label="", widget="menu", names=None):
        if widget not in WIDGETS:
            raise ValueError(f"widget must be one of {list(WIDGETS)}, got {widget!r}")
        object.__setattr__(self, "options", tuple(options))
        object.__setattr__(self, "shown", None if shown is None else tuple(shown))
        object.__setattr__(self, "label", label)
        object.__setattr__(self, "widget", widget)
        object.__setattr__(self, "names", None if names is None else tuple(names))

    def allowed(self) -> str:
        return f"one of {list(self.shown or self.options)}"

    def contains(self, value) -> bool:
        flags = [isinstance(o, bool) for o in self.options]
        if isinstance(value, bool) != all(flags) and (all(flags) or not any(flags)):
            return False  # a bool for a number, or a number for a bool
        ints = self.options and all(_is_int(o) for o in self.options)
        if ints and not _is_int(value):
            return False  # 512.0 == 512, but a float is no int setting (slices, range)
        try:
            return value in self.options
        except (TypeError, ValueError):  # an array, an unhashable value
            return False


def _is_int(x) -> bool:
    """An int setting's value: a Python or NumPy integer, not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclass(frozen=True)
class Range:
    """A number in [lo, hi] on the grid lo + k * step (``step`` None: any number;
    ``integer``: an int); ``log`` ranges (a log slider) read lo, hi and step as powers
    of ten. The live control: a slider labelled ``label``, its value printed with
    ``readout_format`` (ipywidgets' default where None)."""

    lo: float
    hi: float
    step: float | None = None
    integer: bool = True
    log: bool = False
    label: str = ""
    readout_format: str | None = None

    def allowed(self) -> str:
        kind = "an int" if self.integer else "a number"
        if self.log:
            text = f"{kind} in [10^{self.lo}, 10^{self.hi}]"
        else:
            text = f"{kind} in [{self.lo}, {self.hi}]"
        if self.step is not None:
            text += f" in steps of {self.step}" + (" (in log10)" if self.log else "")
        return text

    def contains(self, value) -> bool:
        numbers = (int,) if self.integer else (int, float)
        try:
            import numpy as np

            numbers += (np.integer,) if self.integer else (np.integer, np.floating)
        except ImportError:  # pragma: no cover
            pass
        if isinstance(value, bool) or not isinstance(value, numbers):
            return False
        if not math.isfinite(value):
            return False
        if self.log:
            if value <= 0:
                return False
            x = math.log10(value)
        else:
            x = value
        tol = 1e-9 * max(1.0, abs(self.hi - self.lo))
        if not self.lo - tol <= x <= self.hi + tol:
            return False
        if self.step is None:
            return True
        k = (x - self.lo) / self.step
        return abs(k - round(k)) <= (1e-6 if self.log else 1e-9)


def check(settings: dict, **values) -> None:
    """Every value named in ``values`` must lie in its declaration in ``settings``:
    ValueError "``name`` must be <allowed>, got <value>" otherwise."""
    for name, value in values.items():
        rule = settings[name]
        if not rule.contains(value):
            raise ValueError(f"{name} must be {rule.allowed()}, got {value!r}")


def check_option(name: str, value, options) -> None:
    """A control's value must be one of its options (``check`` with one ``Choice``)."""
    check({name: Choice(options)}, **{name: value})


def index(name: str, value, options, shown=None) -> int:
    """Where ``value`` sits among a control's ``options`` (a static twin's grid), after
    ``check``: ValueError naming the argument and listing the options (``shown``)."""
    check({name: Choice(options, shown)}, **{name: value})
    return list(options).index(value)


#: Every live control's style: its label at full width.
STYLE = {"description_width": "initial"}


def control(rule, value, *, names=None, **extra):
    """The live face's ipywidget for the setting ``rule`` declares, at ``value``
    (checked by the caller): a ``Range`` as an int, float or log slider over its range;
    a ``Choice`` as a drop-down menu, a selection slider (each option shown by its
    ``names``, or ``names`` given here) or a checkbox; labelled ``rule.label``.
    ``extra``: more of the widget's traits (``continuous_update``, ``disabled``)."""
    import ipywidgets as w

    kw = {"value": value, "description": rule.label, "style": STYLE, **extra}
    if isinstance(rule, Range):
        if rule.readout_format is not None:
            kw["readout_format"] = rule.readout_format
        if rule.log:
            return w.FloatLogSlider(
                base=10, min=rule.lo, max=rule.hi, step=rule.step, **kw
            )
        if rule.integer:
            return w.IntSlider(min=rule.lo, max=rule.hi, step=rule.step or 1, **kw)
        step = {} if rule.step is None else {"step": rule.step}
        return w.FloatSlider(min=rule.lo, max=rule.hi, **step, **kw)
    if rule.widget == "checkbox":
        del kw["style"]
        return w.Checkbox(indent=False, **kw)
    names = rule.names if names is None else names
    options = list(rule.options) if names is None else list(zip(names, rule.options))
    kind = w.SelectionSlider if rule.widget == "slider" else w.Dropdown
    return kind(options=options, **kw)


def controls(settings: dict, values: dict, **slider) -> dict:
    """{name: ``control(settings[name], value)``} for each (name, value) of ``values``,
    in its order; ``slider``: traits every slider among them takes
    (``continuous_update=False``)."""
    out = {}
    for name, value in values.items():
        rule = settings[name]
        sliding = isinstance(rule, Range) or rule.widget == "slider"
        out[name] = control(rule, value, **(slider if sliding else {}))
    return out


__all__ = [
    "STYLE",
    "WIDGETS",
    "Choice",
    "Range",
    "check",
    "check_option",
    "control",
    "controls",
    "index",
]
