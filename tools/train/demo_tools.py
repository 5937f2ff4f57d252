"""The four demo tools of `tools.json`, implemented: what a client runs when the model calls one.

The chat corpus (`chat_data.py`) takes its tool results from here, and so do the evaluation
(`evaluate.py chat`) and the round-trip example (`tool_demo.py`). The results are
deterministic and offline: the weather is made up from a hash of the city (there is no weather
service here), conversions and arithmetic are real, and verses come from a table of texts that
the caller supplies (the corpus generator fills it with sentences of the World English Bible;
the example knows a handful of real verses).
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import operator
import os

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS_PATH = os.path.join(HERE, "tools.json")

CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "foggy", "snowy", "clear", "stormy", "humid", "overcast"]

# name -> (dimension, factor to the base unit); temperatures are converted apart.
UNITS: dict[str, tuple[str, float]] = {}
for names, dim, f in [
    (("m", "meter", "meters", "metre", "metres"), "length", 1.0),
    (("km", "kilometer", "kilometers", "kilometre", "kilometres"), "length", 1000.0),
    (("cm", "centimeter", "centimeters", "centimetre", "centimetres"), "length", 0.01),
    (("mm", "millimeter", "millimeters", "millimetre", "millimetres"), "length", 0.001),
    (("mi", "mile", "miles"), "length", 1609.344),
    (("ft", "foot", "feet"), "length", 0.3048),
    (("in", "inch", "inches"), "length", 0.0254),
    (("yd", "yard", "yards"), "length", 0.9144),
    (("kg", "kilogram", "kilograms", "kilo", "kilos"), "mass", 1.0),
    (("g", "gram", "grams"), "mass", 0.001),
    (("lb", "lbs", "pound", "pounds"), "mass", 0.45359237),
    (("oz", "ounce", "ounces"), "mass", 0.028349523125),
    (("t", "tonne", "tonnes", "ton", "tons"), "mass", 1000.0),
    (("stone", "stones"), "mass", 6.35029318),
    (("l", "liter", "liters", "litre", "litres"), "volume", 1.0),
    (("ml", "milliliter", "milliliters", "millilitre", "millilitres"), "volume", 0.001),
    (("gal", "gallon", "gallons"), "volume", 3.785411784),
    (("cup", "cups"), "volume", 0.2365882365),
    (("pint", "pints"), "volume", 0.473176473),
    (("quart", "quarts"), "volume", 0.946352946),
    (("c", "celsius", "°c", "degrees celsius"), "temperature", 0.0),
    (("f", "fahrenheit", "°f", "degrees fahrenheit"), "temperature", 1.0),
    (("k", "kelvin", "kelvins"), "temperature", 2.0),
]:
    for n in names:
        UNITS[n] = (dim, f)


def number(x: float):
    """A result as the tools return it: rounded to 2 decimals, an int when whole."""
    r = round(x, 2)
    return int(r) if r == int(r) else r


def get_weather(city: str, unit: str = "celsius") -> dict:
    h = int(hashlib.sha256(city.strip().lower().encode()).hexdigest(), 16)
    celsius = h % 41 - 8
    temp = celsius if unit == "celsius" else round(celsius * 9 / 5 + 32)
    return {"city": city, "temperature": temp, "unit": unit, "condition": CONDITIONS[(h // 41) % len(CONDITIONS)]}


def _to_celsius(v: float, code: float) -> float:
    return v if code == 0.0 else (v - 32) * 5 / 9 if code == 1.0 else v - 273.15


def _from_celsius(c: float, code: float) -> float:
    return c if code == 0.0 else c * 9 / 5 + 32 if code == 1.0 else c + 273.15


def convert_units(value: float, from_unit: str, to_unit: str) -> dict:
    a, b = UNITS.get(from_unit.strip().lower()), UNITS.get(to_unit.strip().lower())
    if a is None or b is None:
        return {"error": f"unknown unit {from_unit if a is None else to_unit}"}
    if a[0] != b[0]:
        return {"error": f"cannot convert {a[0]} to {b[0]}"}
    if a[0] == "temperature":
        out = _from_celsius(_to_celsius(value, a[1]), b[1])
    else:
        out = value * a[1] / b[1]
    return {"value": number(out), "unit": to_unit}


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow, ast.Mod: operator.mod}


def _eval(node):
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 12:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    raise ValueError("not arithmetic")


def calculate(expression: str) -> dict:
    try:
        v = _eval(ast.parse(expression.replace("^", "**").replace("×", "*").replace("÷", "/"), mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError):
        return {"error": f"cannot evaluate {expression}"}
    if not math.isfinite(v):
        return {"error": f"cannot evaluate {expression}"}
    return {"result": number(v)}


# A few real verses (World English Bible) for the example client.
KNOWN_VERSES = {
    ("john", 3, 16): "For God so loved the world, that he gave his only born Son",
    ("genesis", 1, 1): "In the beginning, God created the heavens and the earth.",
    ("psalms", 23, 1): "Yahweh is my shepherd; I shall lack nothing.",
    ("psalm", 23, 1): "Yahweh is my shepherd; I shall lack nothing.",
    ("john", 11, 35): "Jesus wept.",
    ("proverbs", 3, 5): "Trust in Yahweh with all your heart, and don't lean on your own understanding.",
}


def lookup_verse(book: str, chapter: int, verse: int, table: dict | None = None) -> dict:
    t = KNOWN_VERSES if table is None else table
    text = t.get((book.strip().lower(), int(chapter), int(verse)))
    if text is None:
        return {"error": f"{book} {chapter}:{verse} not found"}
    return {"reference": f"{book} {chapter}:{verse}", "text": text}


def run(name: str, arguments: dict, verses: dict | None = None) -> dict:
    """Run the tool `name` on its parsed arguments; an `{"error": ...}` object for a bad call."""
    try:
        if name == "get_weather":
            return get_weather(**arguments)
        if name == "convert_units":
            return convert_units(**arguments)
        if name == "calculate":
            return calculate(**arguments)
        if name == "lookup_verse":
            return lookup_verse(**arguments, table=verses)
    except TypeError as e:
        return {"error": str(e)}
    return {"error": f"no tool named {name}"}


def result_json(result: dict) -> str:
    """A result as the tool message carries it (compact JSON)."""
    return json.dumps(result, separators=(",", ":"), ensure_ascii=False)


def tools() -> list:
    with open(TOOLS_PATH, encoding="utf-8") as f:
        return json.load(f)
