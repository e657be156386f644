//! A small, strict parser for the Python literals found in `.npy` headers.
//!
//! It accepts what `ast.literal_eval` accepts for the values numpy writes: dicts, strings in
//! `'` or `"` quotes with escapes, non-negative integers, tuples, lists, `True` and `False`.
//! Anything else is an error that carries the byte offset where parsing stopped; no input
//! panics, and nesting is bounded so no input can exhaust the stack.

use std::fmt::Write as _;

/// Deeper nesting than this is refused; numpy headers nest a few levels at most.
const MAX_DEPTH: usize = 64;

/// A parsed value and the byte offset (in the parsed text) where it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Node {
    /// Byte offset in the text.
    pub at: usize,
    /// The value.
    pub value: Value,
}

/// A Python literal value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Value {
    /// `{k: v, ...}` in source order; duplicate keys are kept for the caller to reject.
    Dict(Vec<(Node, Node)>),
    /// `'...'` or `"..."`.
    Str(String),
    /// A non-negative integer that fits in `u64`.
    Int(u64),
    /// A negative integer, by its magnitude (not zero). No header value may be negative, but
    /// parsing one lets the caller say which dimension or size is negative rather than report
    /// a syntax error at a minus sign.
    Neg(u64),
    /// `(a, b)`, `(a,)` or `()`.
    Tuple(Vec<Node>),
    /// `[a, b]`.
    List(Vec<Node>),
    /// `True` or `False`.
    Bool(bool),
}

impl Value {
    /// A short name of the value's type, for "expected X, found Y" messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Dict(_) => "a dict",
            Value::Str(_) => "a string",
            Value::Int(_) => "an integer",
            Value::Neg(_) => "a negative integer",
            Value::Tuple(_) => "a tuple",
            Value::List(_) => "a list",
            Value::Bool(_) => "a bool",
        }
    }
}

/// A syntax error: where, what was wanted, what was there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SyntaxError {
    /// Byte offset in the text.
    pub at: usize,
    /// What the parser wanted.
    pub expected: String,
    /// What it saw.
    pub found: String,
}

/// Parses one literal that makes up the whole of `text`, allowing whitespace around it.
pub(crate) fn parse(text: &str) -> Result<Node, SyntaxError> {
    let mut p = Parser { s: text, pos: 0 };
    p.skip_ws();
    let node = p.value(0)?;
    p.skip_ws();
    if p.pos != text.len() {
        return Err(p.err("end of the literal"));
    }
    Ok(node)
}

/// Renders a string as a Python literal (like `repr`), so that it reads back unchanged.
pub(crate) fn repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Renders a value as a Python literal, the way Python's `repr` does for these types.
pub(crate) fn repr(v: &Value, out: &mut String) {
    fn seq(items: &[Node], open: char, close: char, out: &mut String) {
        out.push(open);
        for (i, n) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            repr(&n.value, out);
        }
        if open == '(' && items.len() == 1 {
            out.push(',');
        }
        out.push(close);
    }
    match v {
        Value::Dict(items) => {
            out.push('{');
            for (i, (k, val)) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(&k.value, out);
                out.push_str(": ");
                repr(&val.value, out);
            }
            out.push('}');
        }
        Value::Str(s) => repr_str(s, out),
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::Neg(i) => {
            let _ = write!(out, "-{i}");
        }
        Value::Tuple(items) => seq(items, '(', ')', out),
        Value::List(items) => seq(items, '[', ']', out),
        Value::Bool(b) => out.push_str(if *b { "True" } else { "False" }),
    }
}

struct Parser<'a> {
    s: &'a str,
    /// Byte offset of the next unread character; always on a char boundary.
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.s[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn skip_ws(&mut self) {
        while let Some(c) = self.peek() {
            if matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c') {
                self.pos += 1;
            } else {
                break;
            }
        }
    }

    /// Describes what is at the cursor: a short quoted snippet or "end of input".
    fn found(&self) -> String {
        let rest = &self.s[self.pos..];
        if rest.is_empty() {
            return "end of input".to_owned();
        }
        let snippet: String = rest.chars().take(16).collect();
        format!("{snippet:?}")
    }

    fn err(&self, expected: impl Into<String>) -> SyntaxError {
        SyntaxError {
            at: self.pos,
            expected: expected.into(),
            found: self.found(),
        }
    }

    fn value(&mut self, depth: usize) -> Result<Node, SyntaxError> {
        if depth > MAX_DEPTH {
            return Err(self.err(format!("at most {MAX_DEPTH} levels of nesting")));
        }
        let at = self.pos;
        let value = match self.peek() {
            Some('{') => self.dict(depth)?,
            Some('[') => Value::List(self.seq(depth, '[', ']')?.0),
            Some('(') => {
                let (items, trailing_comma) = self.seq(depth, '(', ')')?;
                // `(x)` is just `x` in Python; only a comma makes a one-tuple.
                let mut items = items;
                if items.len() == 1 && !trailing_comma {
                    if let Some(inner) = items.pop() {
                        return Ok(Node {
                            at,
                            value: inner.value,
                        });
                    }
                }
                Value::Tuple(items)
            }
            Some('\'' | '"') => Value::Str(self.string()?),
            Some('u' | 'U')
                if matches!(self.s[self.pos + 1..].chars().next(), Some('\'' | '"')) =>
            {
                // Python 2 numpy wrote unicode field names as u'...'.
                self.pos += 1;
                Value::Str(self.string()?)
            }
            Some('0'..='9') => Value::Int(self.int()?),
            Some('-') if matches!(self.s[self.pos + 1..].chars().next(), Some('0'..='9')) => {
                self.pos += 1;
                match self.int()? {
                    0 => Value::Int(0),
                    n => Value::Neg(n),
                }
            }
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                let start = self.pos;
                while matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || c == '_') {
                    self.pos += 1;
                }
                match &self.s[start..self.pos] {
                    "True" => Value::Bool(true),
                    "False" => Value::Bool(false),
                    _ => {
                        self.pos = start;
                        return Err(self
                            .err("a literal (dict, string, integer, tuple, list, True or False)"));
                    }
                }
            }
            _ => {
                return Err(
                    self.err("a literal (dict, string, integer, tuple, list, True or False)")
                )
            }
        };
        Ok(Node { at, value })
    }

    /// Parses `open item, item, ... close`; returns the items and whether a comma followed the last.
    fn seq(
        &mut self,
        depth: usize,
        open: char,
        close: char,
    ) -> Result<(Vec<Node>, bool), SyntaxError> {
        debug_assert_eq!(self.peek(), Some(open));
        self.pos += 1;
        let mut items = Vec::new();
        let mut trailing_comma = false;
        loop {
            self.skip_ws();
            if self.peek() == Some(close) {
                self.pos += 1;
                return Ok((items, trailing_comma));
            }
            if !items.is_empty() && !trailing_comma {
                return Err(self.err(format!("',' or '{close}'")));
            }
            items.push(self.value(depth + 1)?);
            self.skip_ws();
            trailing_comma = self.peek() == Some(',');
            if trailing_comma {
                self.pos += 1;
            }
        }
    }

    fn dict(&mut self, depth: usize) -> Result<Value, SyntaxError> {
        self.pos += 1;
        let mut items = Vec::new();
        let mut comma = true;
        loop {
            self.skip_ws();
            if self.peek() == Some('}') {
                self.pos += 1;
                return Ok(Value::Dict(items));
            }
            if !comma {
                return Err(self.err("',' or '}'"));
            }
            let key = self.value(depth + 1)?;
            self.skip_ws();
            if self.peek() != Some(':') {
                return Err(self.err("':' after a dict key"));
            }
            self.pos += 1;
            self.skip_ws();
            let val = self.value(depth + 1)?;
            items.push((key, val));
            self.skip_ws();
            comma = self.peek() == Some(',');
            if comma {
                self.pos += 1;
            }
        }
    }

    fn int(&mut self) -> Result<u64, SyntaxError> {
        let start = self.pos;
        let mut n: u64 = 0;
        while let Some(c @ '0'..='9') = self.peek() {
            let digit = u64::from(c as u8 - b'0');
            n = match n.checked_mul(10).and_then(|n| n.checked_add(digit)) {
                Some(n) => n,
                None => {
                    self.pos = start;
                    return Err(self.err(format!("an integer at most {}", u64::MAX)));
                }
            };
            self.pos += 1;
        }
        // Python 2 numpy wrote long integers as `3L`.
        if self.peek() == Some('L') {
            self.pos += 1;
        }
        if matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || c == '_' || c == '.') {
            return Err(self.err("a decimal integer"));
        }
        Ok(n)
    }

    fn string(&mut self) -> Result<String, SyntaxError> {
        let quote = match self.bump() {
            Some(q @ ('\'' | '"')) => q,
            _ => return Err(self.err("a quote")),
        };
        let mut out = String::new();
        loop {
            let at = self.pos;
            match self.bump() {
                None => return Err(self.err(format!("closing {quote}"))),
                Some('\n') => {
                    self.pos = at;
                    return Err(self.err(format!("closing {quote} before the end of the line")));
                }
                Some(c) if c == quote => return Ok(out),
                Some('\\') => self.escape(&mut out)?,
                Some(c) => out.push(c),
            }
        }
    }

    fn escape(&mut self, out: &mut String) -> Result<(), SyntaxError> {
        let at = self.pos - 1;
        let c = match self.bump() {
            Some(c) => c,
            None => return Err(self.err("an escape character after '\\'")),
        };
        let simple = match c {
            '\n' => return Ok(()),
            '\\' => '\\',
            '\'' => '\'',
            '"' => '"',
            'a' => '\x07',
            'b' => '\x08',
            'f' => '\x0c',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'v' => '\x0b',
            '0'..='7' => {
                let mut v = c as u32 - '0' as u32;
                for _ in 0..2 {
                    match self.peek() {
                        Some(d @ '0'..='7') => {
                            v = v * 8 + (d as u32 - '0' as u32);
                            self.pos += 1;
                        }
                        _ => break,
                    }
                }
                // At most 0o777, always a valid scalar value.
                char::from_u32(v).unwrap_or('\u{fffd}')
            }
            'x' | 'u' | 'U' => {
                let digits = match c {
                    'x' => 2,
                    'u' => 4,
                    _ => 8,
                };
                let start = self.pos;
                let hex = self
                    .s
                    .get(start..start + digits)
                    .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
                let Some(hex) = hex else {
                    return Err(self.err(format!("{digits} hex digits after \\{c}")));
                };
                let v = u32::from_str_radix(hex, 16).unwrap_or(u32::MAX);
                match char::from_u32(v) {
                    Some(ch) => {
                        self.pos += digits;
                        ch
                    }
                    None => {
                        return Err(SyntaxError {
                            at,
                            expected: "a Unicode scalar value".to_owned(),
                            found: format!("\\{c}{hex}"),
                        })
                    }
                }
            }
            _ => {
                self.pos = at;
                return Err(self.err("a known escape sequence"));
            }
        };
        out.push(simple);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Value {
        match parse(s) {
            Ok(n) => n.value,
            Err(e) => panic!("{s:?} failed: {e:?}"),
        }
    }

    fn err_at(s: &str) -> usize {
        match parse(s) {
            Ok(n) => panic!("{s:?} parsed as {:?}", n.value),
            Err(e) => e.at,
        }
    }

    fn ints(v: &[u64]) -> Vec<Value> {
        v.iter().map(|&i| Value::Int(i)).collect()
    }

    fn values(nodes: &[Node]) -> Vec<Value> {
        nodes.iter().map(|n| n.value.clone()).collect()
    }

    #[test]
    fn numpy_header_dict() {
        let v = ok("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 7), }          \n");
        let Value::Dict(items) = v else {
            panic!("not a dict")
        };
        assert_eq!(items.len(), 3);
        assert_eq!(items[0].0.value, Value::Str("descr".into()));
        assert_eq!(items[0].1.value, Value::Str("<f4".into()));
        assert_eq!(items[1].1.value, Value::Bool(false));
        let Value::Tuple(shape) = &items[2].1.value else {
            panic!("shape not a tuple")
        };
        assert_eq!(values(shape), ints(&[3, 7]));
        assert_eq!(items[2].1.at, 50);
    }

    #[test]
    fn tuples_follow_python() {
        assert_eq!(ok("()"), Value::Tuple(vec![]));
        let Value::Tuple(one) = ok("(5,)") else {
            panic!()
        };
        assert_eq!(values(&one), ints(&[5]));
        assert_eq!(ok("(5)"), Value::Int(5));
        assert_eq!(ok("((5))"), Value::Int(5));
        let Value::List(l) = ok("[1, 2,]") else {
            panic!()
        };
        assert_eq!(values(&l), ints(&[1, 2]));
        assert_eq!(ok("3L"), Value::Int(3));
        assert_eq!(ok(&u64::MAX.to_string()), Value::Int(u64::MAX));
    }

    #[test]
    fn strings_and_escapes() {
        assert_eq!(ok(r#""it's""#), Value::Str("it's".into()));
        assert_eq!(
            ok(r"'a\'b\\c\n\t\x41\u00e9\U0001F600\101'"),
            Value::Str("a'b\\c\n\tA\u{e9}\u{1F600}A".into())
        );
        assert_eq!(ok("u'x'"), Value::Str("x".into()));
        assert_eq!(ok("'é名'"), Value::Str("é名".into()));
        assert_eq!(ok("'a\\\nb'"), Value::Str("ab".into()));
    }

    #[test]
    fn repr_round_trips() {
        for s in [
            "{'a': [('x', '<f4', (3,)), ('', '|V4')], 'b': True, 'c': ()}",
            "\"it's\"",
            "'\\x00\\n\\\\é'",
        ] {
            let v = ok(s);
            let mut out = String::new();
            repr(&v, &mut out);
            assert_eq!(out, s);
            assert_eq!(ok(&out), v);
        }
    }

    #[test]
    fn malformed_inputs_are_errors_with_offsets() {
        assert_eq!(err_at(""), 0);
        assert_eq!(err_at("{'a': 1"), 7);
        assert_eq!(err_at("{'a' 1}"), 5);
        assert_eq!(err_at("{'a': 1 'b': 2}"), 8);
        assert_eq!(err_at("(1, 2"), 5);
        assert_eq!(err_at("(1 2)"), 3);
        assert_eq!(err_at("[1, 2))"), 5);
        assert_eq!(err_at("'abc"), 4);
        assert_eq!(err_at("'ab\ncd'"), 3);
        assert_eq!(err_at("18446744073709551616"), 0);
        assert_eq!(err_at("99999999999999999999999999999"), 0);
        // "-1" parses (as Value::Neg); the header and descr readers refuse it as a negative
        // dimension, tested there.
        assert_eq!(err_at("-"), 0);
        assert_eq!(err_at("--1"), 0);
        assert_eq!(err_at("-18446744073709551616"), 1);
        assert_eq!(err_at("1.5"), 1);
        assert_eq!(err_at("0x10"), 1);
        assert_eq!(err_at("None"), 0);
        assert_eq!(err_at("true"), 0);
        assert_eq!(err_at("'\\q'"), 1);
        assert_eq!(err_at("'\\x4'"), 3);
        assert_eq!(err_at("'\\ud800'"), 1);
        assert_eq!(err_at("'\\"), 2);
        assert_eq!(err_at("b'x'"), 0);
        assert_eq!(err_at("{} {}"), 3);
        assert_eq!(err_at("{'a': 1,, }"), 8);
        assert_eq!(err_at("(,)"), 1);
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let deep = "[".repeat(100_000);
        let e = parse(&deep).unwrap_err();
        assert!(e.expected.contains("nesting"), "{e:?}");
        let ok_depth = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(parse(&ok_depth).is_ok());
    }

    #[test]
    fn no_panic_on_any_prefix_or_byte_flip() {
        let base = "{'descr': [('a', '<f4'), (('t', 'b'), '|u1', (3,))], 'fortran_order': False, 'shape': (10, 2), }";
        for end in 0..=base.len() {
            let _ = parse(&base[..end]);
        }
        let bytes = base.as_bytes();
        for i in 0..bytes.len() {
            for b in [
                b'\'', b'"', b'\\', b'(', b')', b'[', b']', b'{', b'}', b',', b':', b'9', b'\n',
                0u8, b'u',
            ] {
                let mut m = bytes.to_vec();
                m[i] = b;
                if let Ok(s) = std::str::from_utf8(&m) {
                    let _ = parse(s);
                }
            }
        }
    }

    #[test]
    fn negative_integers_are_kept_for_the_caller_to_name() {
        let Value::Tuple(items) = ok("(-3, -0)") else {
            panic!("not a tuple")
        };
        assert_eq!(values(&items), vec![Value::Neg(3), Value::Int(0)]);
        let mut out = String::new();
        repr(&Value::Neg(3), &mut out);
        assert_eq!(out, "-3");
        assert!(parse("-").is_err());
    }
}
