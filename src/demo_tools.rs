//! The four demo tools the built-in model was trained to call
//! (`tools/train/tools.json`), run in-process, so that `cqlm chat` and the
//! server's web page complete a tool call's round trip without a client.
//!
//! Each result is what `tools/train/demo_tools.py` (the corpus generator's
//! implementation) returns for the same call, as the same compact JSON: the
//! weather is made up from a SHA-256 of the city (deterministic, offline),
//! conversions and arithmetic are real, and verses come from a small bundled
//! table. A bad call is an `{"error": …}` object, never a failure: the model
//! reads the error as the tool's answer.

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The tools' OpenAI `tools` array, as the JSON text of `tools/train/tools.json`.
pub const TOOLS_JSON: &str = include_str!("../tools/train/tools.json");

/// The tools' OpenAI `tools` array (function tools with JSON Schema parameters).
pub fn tools() -> Value {
    serde_json::from_str(TOOLS_JSON).expect("tools/train/tools.json is valid JSON")
}

/// Whether `name` is one of the four demo tools.
pub fn is_demo_tool(name: &str) -> bool {
    matches!(
        name,
        "get_weather" | "convert_units" | "calculate" | "lookup_verse"
    )
}

/// Run the tool `name` on `arguments` (the call's JSON text) and return its
/// result as compact JSON: the tool's object, or `{"error": "…"}` for an unknown
/// tool, arguments that are not a JSON object of the tool's parameters, or a
/// value the tool cannot handle.
pub fn call(name: &str, arguments: &str) -> String {
    let args: Value = match serde_json::from_str(arguments) {
        Ok(v) => v,
        Err(e) => return error(format!("the arguments are not JSON: {e}")),
    };
    run(name, &args)
}

/// [`call`] on parsed arguments.
pub fn run(name: &str, args: &Value) -> String {
    let Some(obj) = args.as_object() else {
        return error("the arguments are not a JSON object".into());
    };
    let allowed: &[&str] = match name {
        "get_weather" => &["city", "unit"],
        "convert_units" => &["value", "from_unit", "to_unit"],
        "calculate" => &["expression"],
        "lookup_verse" => &["book", "chapter", "verse"],
        _ => return error(format!("no tool named {name}")),
    };
    if let Some(k) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        return error(format!("{name}() got an unexpected keyword argument '{k}'"));
    }
    let text = |k: &str| obj.get(k).and_then(Value::as_str);
    let num = |k: &str| obj.get(k).and_then(Value::as_f64);
    let missing = |k: &str| error(format!("{name}() missing required argument: '{k}'"));
    match name {
        "get_weather" => match text("city") {
            Some(city) => weather(city, text("unit").unwrap_or("celsius")),
            None => missing("city"),
        },
        "convert_units" => match (num("value"), text("from_unit"), text("to_unit")) {
            (Some(v), Some(a), Some(b)) => convert(v, a, b),
            (None, ..) => missing("value"),
            (_, None, _) => missing("from_unit"),
            _ => missing("to_unit"),
        },
        "calculate" => match text("expression") {
            Some(e) => calculate(e),
            None => missing("expression"),
        },
        _ => match (text("book"), num("chapter"), num("verse")) {
            (Some(b), Some(c), Some(v)) => verse(b, c, v),
            (None, ..) => missing("book"),
            (_, None, _) => missing("chapter"),
            _ => missing("verse"),
        },
    }
}

fn error(message: String) -> String {
    #[derive(Serialize)]
    struct Error {
        error: String,
    }
    to_json(&Error { error: message })
}

fn to_json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("plain structs serialize")
}

/// A number as the tools return it: rounded to 2 decimals, an integer when whole.
fn number(x: f64) -> Value {
    // Python's round(x, 2): ties to even.
    let r = (x * 100.0).round_ties_even() / 100.0;
    if r == r.trunc() && r.abs() < 9.0e15 {
        Value::from(r as i64)
    } else {
        Value::from(r)
    }
}

const CONDITIONS: [&str; 10] = [
    "sunny", "cloudy", "rainy", "windy", "foggy", "snowy", "clear", "stormy", "humid", "overcast",
];

fn weather(city: &str, unit: &str) -> String {
    #[derive(Serialize)]
    struct Weather<'a> {
        city: &'a str,
        temperature: i64,
        unit: &'a str,
        condition: &'a str,
    }
    // The digest as one 256-bit number, reduced mod 410 = 41 × 10: its rest mod 41
    // is the temperature, its quotient by 41 the condition.
    let digest = Sha256::digest(city.trim().to_lowercase().as_bytes());
    let r = digest
        .iter()
        .fold(0u32, |acc, &b| (acc * 256 + u32::from(b)) % 410);
    let celsius = i64::from(r % 41) - 8;
    let temperature = if unit == "celsius" {
        celsius
    } else {
        (celsius as f64 * 9.0 / 5.0 + 32.0).round() as i64
    };
    to_json(&Weather {
        city,
        temperature,
        unit,
        condition: CONDITIONS[(r / 41) as usize],
    })
}

/// A unit's dimension and its factor to the dimension's base unit (temperatures:
/// 0 Celsius, 1 Fahrenheit, 2 Kelvin, converted apart).
fn unit(name: &str) -> Option<(&'static str, f64)> {
    const TABLE: &[(&[&str], &str, f64)] = &[
        (&["m", "meter", "meters", "metre", "metres"], "length", 1.0),
        (
            &["km", "kilometer", "kilometers", "kilometre", "kilometres"],
            "length",
            1000.0,
        ),
        (
            &[
                "cm",
                "centimeter",
                "centimeters",
                "centimetre",
                "centimetres",
            ],
            "length",
            0.01,
        ),
        (
            &[
                "mm",
                "millimeter",
                "millimeters",
                "millimetre",
                "millimetres",
            ],
            "length",
            0.001,
        ),
        (&["mi", "mile", "miles"], "length", 1609.344),
        (&["ft", "foot", "feet"], "length", 0.3048),
        (&["in", "inch", "inches"], "length", 0.0254),
        (&["yd", "yard", "yards"], "length", 0.9144),
        (
            &["kg", "kilogram", "kilograms", "kilo", "kilos"],
            "mass",
            1.0,
        ),
        (&["g", "gram", "grams"], "mass", 0.001),
        (&["lb", "lbs", "pound", "pounds"], "mass", 0.45359237),
        (&["oz", "ounce", "ounces"], "mass", 0.028349523125),
        (&["t", "tonne", "tonnes", "ton", "tons"], "mass", 1000.0),
        (&["stone", "stones"], "mass", 6.35029318),
        (&["l", "liter", "liters", "litre", "litres"], "volume", 1.0),
        (
            &[
                "ml",
                "milliliter",
                "milliliters",
                "millilitre",
                "millilitres",
            ],
            "volume",
            0.001,
        ),
        (&["gal", "gallon", "gallons"], "volume", 3.785411784),
        (&["cup", "cups"], "volume", 0.2365882365),
        (&["pint", "pints"], "volume", 0.473176473),
        (&["quart", "quarts"], "volume", 0.946352946),
        (
            &["c", "celsius", "°c", "degrees celsius"],
            "temperature",
            0.0,
        ),
        (
            &["f", "fahrenheit", "°f", "degrees fahrenheit"],
            "temperature",
            1.0,
        ),
        (&["k", "kelvin", "kelvins"], "temperature", 2.0),
    ];
    let key = name.trim().to_lowercase();
    TABLE
        .iter()
        .find(|(names, ..)| names.contains(&key.as_str()))
        .map(|&(_, dim, f)| (dim, f))
}

fn convert(value: f64, from: &str, to: &str) -> String {
    #[derive(Serialize)]
    struct Converted<'a> {
        value: Value,
        unit: &'a str,
    }
    let (Some(a), Some(b)) = (unit(from), unit(to)) else {
        let bad = if unit(from).is_none() { from } else { to };
        return error(format!("unknown unit {bad}"));
    };
    if a.0 != b.0 {
        return error(format!("cannot convert {} to {}", a.0, b.0));
    }
    let out = if a.0 == "temperature" {
        let celsius = match a.1 as u8 {
            0 => value,
            1 => (value - 32.0) * 5.0 / 9.0,
            _ => value - 273.15,
        };
        match b.1 as u8 {
            0 => celsius,
            1 => celsius * 9.0 / 5.0 + 32.0,
            _ => celsius + 273.15,
        }
    } else {
        value * a.1 / b.1
    };
    to_json(&Converted {
        value: number(out),
        unit: to,
    })
}

fn calculate(expression: &str) -> String {
    #[derive(Serialize)]
    struct Calculated {
        result: Value,
    }
    let text = expression
        .replace('^', "**")
        .replace('×', "*")
        .replace('÷', "/");
    match arith::eval(&text) {
        Some(v) if v.is_finite() => to_json(&Calculated { result: number(v) }),
        _ => error(format!("cannot evaluate {expression}")),
    }
}

/// The bundled verses (World English Bible), keyed by lower-case book.
const VERSES: &[(&str, u32, u32, &str)] = &[
    (
        "john",
        3,
        16,
        "For God so loved the world, that he gave his only born Son",
    ),
    (
        "genesis",
        1,
        1,
        "In the beginning, God created the heavens and the earth.",
    ),
    (
        "psalms",
        23,
        1,
        "Yahweh is my shepherd; I shall lack nothing.",
    ),
    (
        "psalm",
        23,
        1,
        "Yahweh is my shepherd; I shall lack nothing.",
    ),
    ("john", 11, 35, "Jesus wept."),
    (
        "proverbs",
        3,
        5,
        "Trust in Yahweh with all your heart, and don't lean on your own understanding.",
    ),
];

fn verse(book: &str, chapter: f64, verse: f64) -> String {
    #[derive(Serialize)]
    struct Verse<'a> {
        reference: String,
        text: &'a str,
    }
    let (c, v) = (chapter.trunc() as i64, verse.trunc() as i64);
    let key = book.trim().to_lowercase();
    match VERSES
        .iter()
        .find(|&&(b, vc, vv, _)| b == key && i64::from(vc) == c && i64::from(vv) == v)
    {
        Some(&(.., text)) => to_json(&Verse {
            reference: format!("{book} {c}:{v}"),
            text,
        }),
        None => error(format!("{book} {c}:{v} not found")),
    }
}

/// Arithmetic over numbers: `+ - * / % **`, unary signs and parentheses, with
/// Python's precedence (`**` binds tighter than unary minus on its left and is
/// right-associative; `%` takes the divisor's sign). No names, no calls.
mod arith {
    /// The value of `text`, or `None` when it is not such an expression, divides
    /// by zero, or raises to an exponent beyond ±12.
    pub fn eval(text: &str) -> Option<f64> {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.sum()?;
        p.skip();
        (p.i == p.s.len()).then_some(v)
    }

    struct Parser<'a> {
        s: &'a [u8],
        i: usize,
    }

    impl Parser<'_> {
        fn skip(&mut self) {
            while self.s.get(self.i).is_some_and(u8::is_ascii_whitespace) {
                self.i += 1;
            }
        }

        fn eat(&mut self, tok: &str) -> bool {
            self.skip();
            if self.s[self.i..].starts_with(tok.as_bytes()) {
                self.i += tok.len();
                true
            } else {
                false
            }
        }

        fn sum(&mut self) -> Option<f64> {
            let mut v = self.product()?;
            loop {
                if self.eat("+") {
                    v += self.product()?;
                } else if self.eat("-") {
                    v -= self.product()?;
                } else {
                    return Some(v);
                }
            }
        }

        fn product(&mut self) -> Option<f64> {
            let mut v = self.unary()?;
            loop {
                if self.s[self.i..].starts_with(b"**") {
                    return Some(v);
                } else if self.eat("*") {
                    v *= self.unary()?;
                } else if self.eat("/") {
                    let d = self.unary()?;
                    if d == 0.0 {
                        return None;
                    }
                    v /= d;
                } else if self.eat("%") {
                    let d = self.unary()?;
                    if d == 0.0 {
                        return None;
                    }
                    v -= d * (v / d).floor();
                } else {
                    return Some(v);
                }
            }
        }

        fn unary(&mut self) -> Option<f64> {
            if self.eat("-") {
                return Some(-self.unary()?);
            }
            if self.eat("+") {
                return self.unary();
            }
            self.power()
        }

        fn power(&mut self) -> Option<f64> {
            let base = self.atom()?;
            if self.eat("**") {
                let exp = self.unary()?;
                if exp.abs() > 12.0 || (base == 0.0 && exp < 0.0) {
                    return None;
                }
                return Some(base.powf(exp));
            }
            Some(base)
        }

        fn atom(&mut self) -> Option<f64> {
            if self.eat("(") {
                let v = self.sum()?;
                return self.eat(")").then_some(v);
            }
            self.skip();
            let start = self.i;
            let digits = |p: &mut Self| {
                while p.s.get(p.i).is_some_and(u8::is_ascii_digit) {
                    p.i += 1;
                }
            };
            digits(self);
            if self.s.get(self.i) == Some(&b'.') {
                self.i += 1;
                digits(self);
            }
            if self.i > start && matches!(self.s.get(self.i), Some(b'e' | b'E')) {
                let mark = self.i;
                self.i += 1;
                if matches!(self.s.get(self.i), Some(b'+' | b'-')) {
                    self.i += 1;
                }
                let exp_start = self.i;
                digits(self);
                if self.i == exp_start {
                    self.i = mark;
                }
            }
            std::str::from_utf8(&self.s[start..self.i])
                .ok()
                .filter(|t| t.bytes().any(|b| b.is_ascii_digit()))?
                .parse()
                .ok()
        }
    }
}
