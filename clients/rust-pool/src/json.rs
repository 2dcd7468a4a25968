//! A small JSON reader and writer: what the drive protocol needs, standard library only.
//!
//! Integers are kept exact (`i128` covers the trace format's 64-bit range, signed and
//! unsigned); objects keep their fields in order. The reader refuses what standard JSON
//! refuses (NaN, trailing commas, control characters in strings) and nesting deeper
//! than `MAX_DEPTH`.

use std::fmt::Write;

pub const MAX_DEPTH: usize = 64;

#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// The field `name` of an object (None for a missing field or a non-object).
    pub fn get(&self, name: &str) -> Option<&Json> {
        let Json::Obj(fields) = self else { return None };
        fields.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    pub fn as_int(&self) -> Option<i128> {
        if let Json::Int(n) = self { Some(*n) } else { None }
    }

    pub fn as_str(&self) -> Option<&str> {
        if let Json::Str(s) = self { Some(s) } else { None }
    }

    pub fn as_bool(&self) -> Option<bool> {
        if let Json::Bool(b) = self { Some(*b) } else { None }
    }

    pub fn as_arr(&self) -> Option<&Vec<Json>> {
        if let Json::Arr(items) = self { Some(items) } else { None }
    }

    /// Compact JSON text.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        write_json(self, &mut out);
        out
    }
}

/// An object of `fields`, in their order.
pub fn obj(fields: Vec<(&str, Json)>) -> Json {
    Json::Obj(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// Block ids as a JSON array.
pub fn ids(ids: impl IntoIterator<Item = usize>) -> Json {
    Json::Arr(ids.into_iter().map(|b| Json::Int(b as i128)).collect())
}

pub fn write_json(value: &Json, out: &mut String) {
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Int(n) => {
            let _ = write!(out, "{}", n);
        }
        Json::Float(f) => write_float(*f, out),
        Json::Str(s) => write_str(s, out),
        Json::Arr(items) => write_seq(items, '[', ']', out, write_json),
        Json::Obj(fields) => write_seq(fields, '{', '}', out, |(k, v), out| {
            write_str(k, out);
            out.push(':');
            write_json(v, out);
        }),
    }
}

/// `items` between `open` and `close`, separated by commas, each written by `write`.
fn write_seq<T>(items: &[T], open: char, close: char, out: &mut String, write: impl Fn(&T, &mut String)) {
    out.push(open);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write(item, out);
    }
    out.push(close);
}

/// A finite float in its shortest round-trip form, always with a fraction or exponent.
pub fn write_float(f: f64, out: &mut String) {
    if !f.is_finite() {
        out.push_str("null");
        return;
    }
    let text = format!("{}", f);
    out.push_str(&text);
    if !text.contains(['.', 'e', 'E']) {
        out.push_str(".0");
    }
}

pub fn write_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Parse one JSON value that makes up the whole of `text` (whitespace around it allowed).
pub fn parse(text: &str) -> Result<Json, String> {
    let mut p = Parser { s: text.as_bytes(), i: 0 };
    let value = p.value(0)?;
    p.ws();
    p.fail_if(p.i != p.s.len(), "unexpected text after the value")?;
    Ok(value)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Parser<'a> {
    fn ws(&mut self) {
        self.i += self.s[self.i..].iter().take_while(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r')).count();
    }

    fn err<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("{} at byte {}", what, self.i))
    }

    fn fail_if(&self, cond: bool, what: &str) -> Result<(), String> {
        if cond { self.err(what) } else { Ok(()) }
    }

    fn value(&mut self, depth: usize) -> Result<Json, String> {
        self.fail_if(depth > MAX_DEPTH, "nested too deeply")?;
        self.ws();
        match self.s.get(self.i) {
            None => self.err("unexpected end"),
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => Ok(Json::Str(self.string()?)),
            Some(b't') => self.word("true", Json::Bool(true)),
            Some(b'f') => self.word("false", Json::Bool(false)),
            Some(b'n') => self.word("null", Json::Null),
            Some(c) if *c == b'-' || c.is_ascii_digit() => self.number(),
            Some(_) => self.err("unexpected character"),
        }
    }

    fn word(&mut self, word: &str, value: Json) -> Result<Json, String> {
        self.fail_if(!self.s[self.i..].starts_with(word.as_bytes()), "unexpected word")?;
        self.i += word.len();
        Ok(value)
    }

    fn number(&mut self) -> Result<Json, String> {
        let start = self.i;
        self.eat(b"-");
        let first = self.i;
        let digits = self.digits();
        self.fail_if(digits == 0 || (self.s[first] == b'0' && digits > 1), "bad number")?;
        let fraction = self.eat(b".");
        if fraction && self.digits() == 0 {
            return self.err("bad fraction");
        }
        let exponent = self.eat(b"eE");
        if exponent {
            self.eat(b"+-");
            let exponent_digits = self.digits();
            self.fail_if(exponent_digits == 0, "bad exponent")?;
        }
        let text = std::str::from_utf8(&self.s[start..self.i]).map_err(|e| e.to_string())?;
        if fraction || exponent {
            text.parse::<f64>().map(Json::Float).map_err(|e| e.to_string())
        } else {
            // Beyond i128 an integer cannot be a trace value: say so rather than wrap.
            text.parse::<i128>().map(Json::Int).map_err(|_| format!("integer {} out of range", text))
        }
    }

    /// Skips one byte if it is one of `any`; whether it did.
    fn eat(&mut self, any: &[u8]) -> bool {
        let hit = self.s.get(self.i).is_some_and(|c| any.contains(c));
        self.i += hit as usize;
        hit
    }

    /// Skips a run of ASCII digits; how many there were.
    fn digits(&mut self) -> usize {
        let n = self.s[self.i..].iter().take_while(|c| c.is_ascii_digit()).count();
        self.i += n;
        n
    }

    fn hex4(&mut self) -> Result<u32, String> {
        self.fail_if(self.i + 4 > self.s.len(), "short \\u escape")?;
        let text = std::str::from_utf8(&self.s[self.i..self.i + 4]).map_err(|e| e.to_string())?;
        let code = u32::from_str_radix(text, 16).map_err(|_| "bad \\u escape".to_string())?;
        self.i += 4;
        Ok(code)
    }

    fn string(&mut self) -> Result<String, String> {
        self.i += 1; // the opening quote
        let mut out = String::new();
        loop {
            let start = self.i;
            while self.i < self.s.len() && !matches!(self.s[self.i], b'"' | b'\\') && self.s[self.i] >= 0x20 {
                self.i += 1;
            }
            out.push_str(std::str::from_utf8(&self.s[start..self.i]).map_err(|e| e.to_string())?);
            match self.s.get(self.i) {
                None => return self.err("unterminated string"),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.i += 1;
                    let c = *self.s.get(self.i).ok_or("unterminated escape")?;
                    self.i += 1;
                    match c {
                        b'"' | b'\\' | b'/' => out.push(c as char),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let mut code = self.hex4()?;
                            if (0xD800..0xDC00).contains(&code) && self.s[self.i..].starts_with(b"\\u") {
                                self.i += 2;
                                let low = self.hex4()?;
                                self.fail_if(!(0xDC00..0xE000).contains(&low), "bad surrogate pair")?;
                                code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                            }
                            out.push(char::from_u32(code).ok_or("bad code point")?);
                        }
                        _ => return self.err("bad escape"),
                    }
                }
                Some(_) => return self.err("control character in string"),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Json, String> {
        self.items(b']', "expected , or ]", |p| p.value(depth + 1)).map(Json::Arr)
    }

    fn object(&mut self, depth: usize) -> Result<Json, String> {
        let field = |p: &mut Self| {
            p.ws();
            p.fail_if(p.s.get(p.i) != Some(&b'"'), "expected a field name")?;
            let key = p.string()?;
            p.ws();
            let colon = p.eat(b":");
            p.fail_if(!colon, "expected :")?;
            Ok((key, p.value(depth + 1)?))
        };
        self.items(b'}', "expected , or }", field).map(Json::Obj)
    }

    /// The comma-separated items of an array or object, each read by `item`, up to `close`.
    fn items<T>(
        &mut self,
        close: u8,
        expected: &str,
        mut item: impl FnMut(&mut Self) -> Result<T, String>,
    ) -> Result<Vec<T>, String> {
        self.i += 1; // the opening bracket
        let mut items = Vec::new();
        self.ws();
        if self.eat(&[close]) {
            return Ok(items);
        }
        loop {
            items.push(item(self)?);
            self.ws();
            if !self.eat(b",") {
                return if self.eat(&[close]) { Ok(items) } else { self.err(expected) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let text = r#"{"a":[1,-2,18446744073709551615,true,null,"x\"y\u00e9"],"b":{"c":0.5}}"#;
        let value = parse(text).unwrap();
        assert_eq!(value.get("a").unwrap().as_arr().unwrap()[2], Json::Int(18446744073709551615));
        assert_eq!(parse(&value.dump()).unwrap(), value);
    }

    #[test]
    fn refuses_what_json_refuses() {
        for bad in ["NaN", "[1,]", "{\"a\" 1}", "01", "\"\u{1}\"", "[", "1 2", "-", "1.", "1e+", ".5"] {
            assert!(parse(bad).is_err(), "{}", bad);
        }
        let deep = "[".repeat(MAX_DEPTH + 2) + &"]".repeat(MAX_DEPTH + 2);
        assert!(parse(&deep).is_err());
    }

    #[test]
    fn reads_numbers_as_json_writes_them() {
        assert_eq!(parse("-0").unwrap(), Json::Int(0));
        assert_eq!(parse("-10").unwrap(), Json::Int(-10));
        assert_eq!(parse("1e+2").unwrap(), Json::Float(100.0));
        assert_eq!(parse("-0.25E-1").unwrap(), Json::Float(-0.025));
    }

    #[test]
    fn floats_keep_a_fraction() {
        assert_eq!(Json::Float(1.0).dump(), "1.0");
        assert_eq!(Json::Float(0.25).dump(), "0.25");
    }
}
