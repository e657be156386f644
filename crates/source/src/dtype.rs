//! Element dtypes: numpy descrs as found in `.npy` headers, and dtype names typed by users.
//!
//! A [`DType`] keeps its numpy descr as a Python literal (`'<f4'`,
//! `[('x', '<f4'), ('y', '|u1', (3,))]`) so that it can be written back into a `.npy` header
//! and read by numpy unchanged. Only dtypes whose bytes mean the same on every little-endian
//! machine are accepted: no object arrays, no big-endian multi-byte types.

use std::collections::HashSet;
use std::fmt;

use crate::literal::{self, Node, Value};
use crate::{Result, SourceError};

/// What kind of scalar a simple (non-structured) dtype holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ScalarKind {
    /// `bool` (`|b1`).
    Bool,
    /// Signed integer (`i1` .. `i8`).
    Int,
    /// Unsigned integer (`u1` .. `u8`).
    UInt,
    /// IEEE float (`f2`, `f4`, `f8`).
    Float,
    /// Complex of two floats (`c8`, `c16`).
    Complex,
    /// Fixed-length byte string (`S<n>`).
    Bytes,
    /// Fixed-length UCS-4 string (`U<n>`).
    Str,
    /// Raw bytes (`V<n>`).
    Void,
    /// `datetime64` (`M8[unit]`).
    DateTime,
    /// `timedelta64` (`m8[unit]`).
    TimeDelta,
}

/// An element dtype, as numpy describes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DType {
    /// The numpy descr as a Python literal, usable by
    /// `numpy.lib.format.descr_to_dtype(ast.literal_eval(descr))`; byte orders are canonical
    /// (`'<'` for multi-byte types, `'|'` where byte order does not apply).
    pub descr: String,
    /// Bytes in one element, padding included.
    pub itemsize: usize,
    /// `None` for structured dtypes.
    kind: Option<ScalarKind>,
}

impl DType {
    /// Parses the value of the `'descr'` key of a `.npy` header, given as Python literal text:
    /// a typestring such as `'<f4'`, or a list of fields for a structured dtype.
    pub fn from_descr_literal(s: &str) -> Result<DType> {
        let node = literal::parse(s).map_err(|e| SourceError::DType {
            path: None,
            descr: s.to_owned(),
            reason: format!(
                "malformed literal at byte {}: expected {}, found {}",
                e.at, e.expected, e.found
            ),
        })?;
        DType::from_node(&node)
    }

    /// Builds a dtype from a parsed descr value.
    pub(crate) fn from_node(node: &Node) -> Result<DType> {
        let fail = |reason: String| {
            let mut descr = String::new();
            literal::repr(&node.value, &mut descr);
            SourceError::DType {
                path: None,
                descr,
                reason,
            }
        };
        match &node.value {
            Value::Str(s) => {
                let t = parse_typestr(s).map_err(fail)?;
                Ok(t)
            }
            Value::List(_) => {
                let (canon, itemsize) = structured(node, 0).map_err(fail)?;
                let mut descr = String::new();
                literal::repr(&canon, &mut descr);
                Ok(DType {
                    descr,
                    itemsize,
                    kind: None,
                })
            }
            other => Err(fail(format!(
                "expected a typestring like '<f4' or a list of fields, found {}",
                other.kind()
            ))),
        }
    }

    /// `true` for a plain scalar dtype, `false` for a structured one.
    pub fn is_simple(&self) -> bool {
        self.kind.is_some()
    }

    /// The scalar kind of a simple dtype; `None` for a structured one.
    pub fn scalar_kind(&self) -> Option<ScalarKind> {
        self.kind
    }

    /// The one-byte unsigned integer dtype, `'|u1'`.
    pub fn uint8() -> DType {
        DType {
            descr: "'|u1'".to_owned(),
            itemsize: 1,
            kind: Some(ScalarKind::UInt),
        }
    }

    /// The typestring of a simple dtype without quotes (`<f4`), `None` when structured.
    fn typestr(&self) -> Option<&str> {
        self.kind?;
        self.descr.get(1..self.descr.len().saturating_sub(1))
    }
}

impl fmt::Display for DType {
    /// A short name: numpy's name for numbers (`uint8`, `float32`), the typestring for strings,
    /// bytes and dates (`|S16`, `<M8[ns]`), the descr for structured dtypes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only numbers have a bit width, and their itemsize is small; computing it for any dtype
        // would overflow on absurd sub-array sizes, which error messages still need to name.
        let bits = self.itemsize.saturating_mul(8);
        match self.kind {
            Some(ScalarKind::Bool) => f.write_str("bool"),
            Some(ScalarKind::Int) => write!(f, "int{bits}"),
            Some(ScalarKind::UInt) => write!(f, "uint{bits}"),
            Some(ScalarKind::Float) => write!(f, "float{bits}"),
            Some(ScalarKind::Complex) => write!(f, "complex{bits}"),
            Some(_) => f.write_str(self.typestr().unwrap_or(&self.descr)),
            None => f.write_str(&self.descr),
        }
    }
}

const BIG_ENDIAN: &str = "big-endian data is not supported; convert with \
    arr.astype(arr.dtype.newbyteorder('<')) before saving";
const OBJECT: &str = "object arrays hold pointers to Python objects, not data, and cannot be \
    streamed; store a numeric or fixed-size dtype instead";

/// Parses a numpy typestring (`'<f4'`, `'|S5'`, `'<M8[ns]'`); the byte order may be absent.
fn parse_typestr(s: &str) -> Result<DType, String> {
    let (order, rest) = match s.as_bytes().first() {
        Some(&c @ (b'<' | b'>' | b'|' | b'=' | b'!')) => (Some(c), &s[1..]),
        _ => (None, s),
    };
    let mut chars = rest.chars();
    let code = chars.next().ok_or_else(|| "empty typestring".to_owned())?;
    let tail = chars.as_str();
    if code == 'O' {
        return Err(OBJECT.to_owned());
    }
    let digits_end = tail
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(tail.len());
    let (num, unit) = tail.split_at(digits_end);
    let n: usize = match num.parse() {
        Ok(n) => n,
        Err(_) if num.is_empty() => {
            return Err(format!("typestring {s:?} has no size after '{code}'"))
        }
        Err(_) => return Err(format!("size {num} in {s:?} is too large")),
    };
    let sized = |ok: &[usize], kind| {
        if ok.contains(&n) {
            Ok((kind, n))
        } else {
            Err(format!(
                "unknown typestring {s:?}: '{code}' takes sizes {ok:?}"
            ))
        }
    };
    if !unit.is_empty() && !matches!(code, 'M' | 'm') {
        return Err(format!(
            "unknown typestring {s:?}: unexpected {unit:?} after the size"
        ));
    }
    let (kind, itemsize) = match code {
        'b' => sized(&[1], ScalarKind::Bool)?,
        'i' => sized(&[1, 2, 4, 8], ScalarKind::Int)?,
        'u' => sized(&[1, 2, 4, 8], ScalarKind::UInt)?,
        'f' => sized(&[2, 4, 8], ScalarKind::Float)?,
        'c' => sized(&[8, 16], ScalarKind::Complex)?,
        'S' | 'V' | 'U' if n == 0 => return Err(format!("typestring {s:?} has size 0")),
        'S' => (ScalarKind::Bytes, n),
        'V' => (ScalarKind::Void, n),
        'U' => (ScalarKind::Str, n.checked_mul(4).ok_or_else(|| format!("size of {s:?} overflows"))?),
        'M' | 'm' => {
            if !valid_time_unit(unit) {
                return Err(format!(
                    "unknown datetime unit {unit:?} in {s:?}; expected e.g. [ns], [us], [s], [D] or none"
                ));
            }
            let kind = if code == 'M' { ScalarKind::DateTime } else { ScalarKind::TimeDelta };
            sized(&[8], kind)?
        }
        _ => {
            return Err(format!(
                "unknown type code '{code}' in {s:?}; accepted: b1, i1 i2 i4 i8, u1 u2 u4 u8, f2 f4 f8, \
                 c8 c16, S<n>, U<n>, V<n>, M8[unit], m8[unit]"
            ))
        }
    };
    let order_matters = itemsize > 1 && !matches!(kind, ScalarKind::Bytes | ScalarKind::Void);
    if order_matters && matches!(order, Some(b'>' | b'!')) {
        return Err(BIG_ENDIAN.to_owned());
    }
    let canon_order = if order_matters { '<' } else { '|' };
    let descr = format!("'{canon_order}{code}{num}{unit}'");
    Ok(DType {
        descr,
        itemsize,
        kind: Some(kind),
    })
}

fn valid_time_unit(unit: &str) -> bool {
    if unit.is_empty() {
        return true;
    }
    let Some(inner) = unit.strip_prefix('[').and_then(|u| u.strip_suffix(']')) else {
        return false;
    };
    let inner = inner.trim_start_matches(|c: char| c.is_ascii_digit());
    matches!(
        inner,
        "Y" | "M"
            | "W"
            | "D"
            | "h"
            | "m"
            | "s"
            | "ms"
            | "us"
            | "μs"
            | "ns"
            | "ps"
            | "fs"
            | "as"
            | "generic"
    )
}

/// Deeper field nesting than this is refused (the literal parser bounds it too).
const MAX_FIELD_DEPTH: usize = 32;

/// Checks a structured descr (a list of field tuples) and returns it with canonical
/// typestrings, plus its itemsize. numpy's padding fields `('', '|V4')` count like any other.
fn structured(node: &Node, depth: usize) -> Result<(Value, usize), String> {
    let Value::List(fields) = &node.value else {
        return Err(format!(
            "expected a list of fields, found {}",
            node.value.kind()
        ));
    };
    if depth > MAX_FIELD_DEPTH {
        return Err(format!(
            "fields nest more than {MAX_FIELD_DEPTH} levels deep"
        ));
    }
    let mut names = HashSet::new();
    let mut out = Vec::with_capacity(fields.len());
    let mut total: usize = 0;
    for (i, field) in fields.iter().enumerate() {
        let (canon, size) = structured_field(i, field, depth, &mut names)?;
        total = total
            .checked_add(size)
            .ok_or_else(|| "structured dtype size overflows".to_owned())?;
        out.push(canon);
    }
    Ok((Value::List(out), total))
}

/// Checks field `i`, `(name, format[, shape])`, whose name must not be in `names` yet; returns
/// it canonical and its size in bytes.
fn structured_field(
    i: usize,
    field: &Node,
    depth: usize,
    names: &mut HashSet<String>,
) -> Result<(Node, usize), String> {
    let Value::Tuple(parts) = &field.value else {
        return Err(format!(
            "field {i}: expected a tuple (name, format[, shape]), found {}",
            field.value.kind()
        ));
    };
    if !(2..=3).contains(&parts.len()) {
        return Err(format!(
            "field {i}: expected a tuple (name, format[, shape]), found {} items",
            parts.len()
        ));
    }
    let name = field_name(i, &parts[0])?;
    if !name.is_empty() && !names.insert(name.to_owned()) {
        return Err(format!("duplicate field name {name:?}"));
    }
    let in_field = |e: String| format!("field {name:?}: {e}");
    let (format, mut size) = field_format(&parts[1], depth).map_err(in_field)?;
    let mut canon = vec![
        parts[0].clone(),
        Node {
            at: parts[1].at,
            value: format,
        },
    ];
    if let Some(shape) = parts.get(2) {
        let (shape, count) = sub_array_shape(shape).map_err(in_field)?;
        size = size
            .checked_mul(count)
            .ok_or_else(|| "structured dtype size overflows".to_owned())?;
        canon.push(shape);
    }
    Ok((
        Node {
            at: field.at,
            value: Value::Tuple(canon),
        },
        size,
    ))
}

/// A field's name: a string, or the name of a `(title, name)` pair.
fn field_name(i: usize, node: &Node) -> Result<&str, String> {
    match &node.value {
        Value::Str(n) => Ok(n),
        Value::Tuple(t) if t.len() == 2 => match (&t[0].value, &t[1].value) {
            (Value::Str(_), Value::Str(n)) => Ok(n),
            _ => Err(format!(
                "field {i}: a (title, name) pair must hold two strings"
            )),
        },
        other => Err(format!(
            "field {i}: expected a name or (title, name), found {}",
            other.kind()
        )),
    }
}

/// A field's format, canonical, and its size: a typestring, a list of fields, or numpy's
/// sub-array pair `(format, shape)`, which numpy writes for a field whose dtype is itself a
/// sub-array (`[('c', ('<f8', (5,)), (2,))]` is a (2, 5) float64 field).
fn field_format(node: &Node, depth: usize) -> Result<(Value, usize), String> {
    match &node.value {
        Value::Str(t) => {
            let d = parse_typestr(t)?;
            let inner = d.descr[1..d.descr.len() - 1].to_owned();
            Ok((Value::Str(inner), d.itemsize))
        }
        Value::List(_) => structured(node, depth + 1),
        Value::Tuple(pair) if pair.len() == 2 => {
            if depth > MAX_FIELD_DEPTH {
                return Err(format!(
                    "sub-arrays nest more than {MAX_FIELD_DEPTH} levels deep"
                ));
            }
            let (inner, size) = field_format(&pair[0], depth + 1)?;
            let (shape, count) = sub_array_shape(&pair[1])?;
            let size = size
                .checked_mul(count)
                .ok_or_else(|| "sub-array size overflows".to_owned())?;
            let inner = Node {
                at: pair[0].at,
                value: inner,
            };
            Ok((Value::Tuple(vec![inner, shape]), size))
        }
        other => Err(format!(
            "expected a typestring, a list of fields or a (format, shape) sub-array, found {}",
            other.kind()
        )),
    }
}

/// A sub-array shape (`(2, 3)` or `2`) as a canonical tuple, and its element count.
fn sub_array_shape(shape: &Node) -> Result<(Node, usize), String> {
    let dims: Vec<u64> = match &shape.value {
        Value::Int(n) => vec![*n],
        Value::Tuple(t) => t
            .iter()
            .map(|d| match d.value {
                Value::Int(n) => Ok(n),
                Value::Neg(n) => Err(format!("negative dimension -{n} in a sub-array shape")),
                ref other => Err(format!("shape holds {}, not an integer", other.kind())),
            })
            .collect::<Result<_, _>>()?,
        Value::Neg(n) => return Err(format!("negative dimension -{n} in a sub-array shape")),
        other => return Err(format!("expected a shape tuple, found {}", other.kind())),
    };
    let mut count: usize = 1;
    for &d in &dims {
        count = usize::try_from(d)
            .ok()
            .and_then(|d| count.checked_mul(d))
            .ok_or_else(|| format!("shape {dims:?} overflows"))?;
    }
    let tuple = dims
        .iter()
        .map(|&d| Node {
            at: shape.at,
            value: Value::Int(d),
        })
        .collect();
    let node = Node {
        at: shape.at,
        value: Value::Tuple(tuple),
    };
    Ok((node, count))
}

/// What [`parse_user_dtype`] accepts, for its error message.
const ACCEPTED: &str = "expected a Rust name (u8 i8 u16 i16 u32 i32 u64 i64 f16 f32 f64 bool; u8 is one byte), \
    a numpy name (uint8 int8 uint16 int16 uint32 int32 uint64 int64 float16 float32 float64 complex64 \
    complex128 bool), a numpy typestring with its byte order ('<f4', '|u1', '<u8', '|S16', '<U8', '|V4', \
    '<M8[ns]'), a numpy character code (B b H h I i L l Q q e f d F D ?), any of these after numpy's \
    sub-array shape ('3,31,31B' or '(3,31,31)B'), or a structured descr list (\"[('x', '<f4'), ('y', '|u1', (3,))]\")";

/// Parses a dtype typed by a user (command line, raw files): returns the element dtype and the
/// leading per-record shape given by numpy's sub-array forms (`"3,31,31B"` and `"(3,31,31)B"`
/// give `uint8` and `[3, 31, 31]`; `"f32"` gives `float32` and `[]`).
///
/// Rust names mean what they mean in Rust (`u8` is one byte); numpy typestrings must carry their
/// byte order (`'<u8'` is numpy's 8-byte unsigned integer) so that the two cannot be confused.
pub fn parse_user_dtype(s: &str) -> Result<(DType, Vec<u64>)> {
    let fail = |reason: String| SourceError::DType {
        path: None,
        descr: format!("{s:?}"),
        reason,
    };
    let t = s.trim();
    if t.starts_with('[') {
        return DType::from_descr_literal(t).map(|d| (d, Vec::new()));
    }
    let (shape, name) = split_sub_array(t).map_err(fail)?;
    if name.contains(',') {
        return Err(fail(format!(
            "comma-separated structured dtypes are not supported; give a descr list instead; {ACCEPTED}"
        )));
    }
    let typestr = match user_name_typestr(name) {
        Some(t) => t,
        None if name.starts_with(['<', '>', '|', '=', '!']) => name,
        None if parse_typestr(name).is_ok() => {
            return Err(fail(format!(
                "{name:?} looks like a numpy typestring without a byte order, which is ambiguous next to \
                 Rust names (numpy 'u8' is 8 bytes, Rust u8 is 1); write it with its byte order, e.g. '<{name}' \
                 or '|{name}'"
            )))
        }
        None => return Err(fail(ACCEPTED.to_owned())),
    };
    let dtype = parse_typestr(typestr).map_err(|e| fail(format!("{e}; {ACCEPTED}")))?;
    Ok((dtype, shape))
}

/// Splits numpy's sub-array shape off the front of a user dtype: `3,31,31B` (a comma-separated
/// shape glued to the element type) or `(3,31,31)B`; returns the shape and the element type.
fn split_sub_array(t: &str) -> Result<(Vec<u64>, &str), String> {
    let (shape_text, name) = if let Some(rest) = t.strip_prefix('(') {
        let Some(close) = rest.find(')') else {
            return Err(format!(
                "the sub-array shape {t:?} has no closing ')'; {ACCEPTED}"
            ));
        };
        let inner = rest[..close].trim();
        // `(3,)` is a one-dimensional shape, `()` none.
        (
            inner.strip_suffix(',').unwrap_or(inner),
            rest[close + 1..].trim_start(),
        )
    } else {
        let end = t
            .find(|c: char| !(c.is_ascii_digit() || c == ',' || c == '-'))
            .unwrap_or(t.len());
        t.split_at(end)
    };
    if shape_text.is_empty() {
        return Ok((Vec::new(), name));
    }
    let mut shape = Vec::new();
    for part in shape_text.split(',') {
        let part = part.trim();
        if part
            .strip_prefix('-')
            .is_some_and(|d| d.parse::<u64>().is_ok())
        {
            return Err(format!(
                "negative dimension {part} in the sub-array shape {shape_text:?}"
            ));
        }
        let d = part
            .parse::<u64>()
            .map_err(|_| format!("cannot read the sub-array shape {shape_text:?}; {ACCEPTED}"))?;
        shape.push(d);
    }
    Ok((shape, name))
}

/// The typestring for a Rust name, numpy name or numpy character code.
fn user_name_typestr(name: &str) -> Option<&'static str> {
    Some(match name {
        "u8" | "uint8" | "B" | "ubyte" => "|u1",
        "i8" | "int8" | "b" | "byte" => "|i1",
        "u16" | "uint16" | "H" | "ushort" => "<u2",
        "i16" | "int16" | "h" | "short" => "<i2",
        "u32" | "uint32" | "I" | "uintc" => "<u4",
        "i32" | "int32" | "i" | "intc" => "<i4",
        // `L`/`l` are C longs: 8 bytes on the LP64 Unix systems this crate runs on.
        "u64" | "uint64" | "Q" | "L" | "ulonglong" => "<u8",
        "i64" | "int64" | "q" | "l" | "longlong" => "<i8",
        "f16" | "float16" | "e" | "half" => "<f2",
        "f32" | "float32" | "f" | "single" => "<f4",
        "f64" | "float64" | "d" | "double" => "<f8",
        "complex64" | "F" => "<c8",
        "complex128" | "D" => "<c16",
        "bool" | "bool_" | "?" => "|b1",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descr(s: &str) -> DType {
        DType::from_descr_literal(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn descr_err(s: &str) -> String {
        match DType::from_descr_literal(s) {
            Ok(d) => panic!("{s} was accepted as {d:?}"),
            Err(e @ SourceError::DType { .. }) => e.to_string(),
            Err(e) => panic!("{s}: wrong variant {e:?}"),
        }
    }

    fn user(s: &str) -> (String, usize, Vec<u64>) {
        let (d, shape) = parse_user_dtype(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        (d.descr, d.itemsize, shape)
    }

    #[test]
    fn simple_descrs() {
        for (s, canon, size, name) in [
            ("'|u1'", "'|u1'", 1, "uint8"),
            ("'<f4'", "'<f4'", 4, "float32"),
            ("'=f8'", "'<f8'", 8, "float64"),
            ("'|f2'", "'<f2'", 2, "float16"),
            ("'<i8'", "'<i8'", 8, "int64"),
            ("'|b1'", "'|b1'", 1, "bool"),
            ("'<c16'", "'<c16'", 16, "complex128"),
            ("'|S5'", "'|S5'", 5, "|S5"),
            ("'<U3'", "'<U3'", 12, "<U3"),
            ("'|V16'", "'|V16'", 16, "|V16"),
            ("'<M8[ns]'", "'<M8[ns]'", 8, "<M8[ns]"),
            ("'<m8[10s]'", "'<m8[10s]'", 8, "<m8[10s]"),
            ("'>u1'", "'|u1'", 1, "uint8"),
            ("'>S4'", "'|S4'", 4, "|S4"),
            ("\"<u2\"", "'<u2'", 2, "uint16"),
        ] {
            let d = descr(s);
            assert_eq!(
                (d.descr.as_str(), d.itemsize, d.to_string().as_str()),
                (canon, size, name),
                "{s}"
            );
            assert!(d.is_simple());
        }
        assert_eq!(descr("'<f4'").scalar_kind(), Some(ScalarKind::Float));
    }

    #[test]
    fn structured_descrs() {
        let d = descr("[('a', '<f4'), ('', '|V4'), ('b', '|u1', (3,)), ('', '|V5')]");
        assert_eq!(d.itemsize, 16);
        assert!(!d.is_simple());
        assert_eq!(
            d.descr,
            "[('a', '<f4'), ('', '|V4'), ('b', '|u1', (3,)), ('', '|V5')]"
        );
        assert_eq!(d.to_string(), d.descr);
        // Titles, nesting, int shapes and '=' are normalised.
        let d = descr("[(('title', 'x'), '=f8', 2), ('n', [('p', '<i2', (2, 3)), ('q', '|b1')])]");
        assert_eq!(d.itemsize, 16 + 12 + 1);
        assert_eq!(
            d.descr,
            "[(('title', 'x'), '<f8', (2,)), ('n', [('p', '<i2', (2, 3)), ('q', '|b1')])]"
        );
        assert_eq!(descr("[('é名', '<i4')]").itemsize, 4);
        // A field whose format is a sub-array pair, as numpy writes it; nested pairs and int
        // shapes too.
        let d = descr("[('c', ('<f8', (5,)), (2,))]");
        assert_eq!(
            (d.itemsize, d.descr.as_str()),
            (80, "[('c', ('<f8', (5,)), (2,))]")
        );
        let d = descr("[('c', (('|u1', 3), (2, 2)))]");
        assert_eq!(
            (d.itemsize, d.descr.as_str()),
            (12, "[('c', (('|u1', (3,)), (2, 2)))]")
        );
        let d = descr("[('s', ([('x', '<f4')], (2,)))]");
        assert_eq!(d.itemsize, 8);
        assert_eq!(descr("[]").itemsize, 0);
    }

    #[test]
    fn rejected_descrs() {
        assert!(descr_err("'>f4'").contains("big-endian"));
        assert!(descr_err("'!i2'").contains("big-endian"));
        assert!(descr_err("'>U2'").contains("big-endian"));
        assert!(descr_err("'|O'").contains("object"));
        assert!(descr_err("'O8'").contains("object"));
        assert!(descr_err("[('a', '<f4'), ('b', [('c', '|O')])]").contains("object"));
        assert!(descr_err("[('a', '>f8')]").contains("big-endian"));
        assert!(descr_err("'<f16'").contains("sizes"));
        assert!(descr_err("'<i3'").contains("sizes"));
        assert!(descr_err("'<q8'").contains("unknown type code"));
        assert!(descr_err("'<f'").contains("no size"));
        assert!(descr_err("''").contains("empty"));
        assert!(descr_err("'|S0'").contains("size 0"));
        assert!(descr_err("'|S99999999999999999999999'").contains("too large"));
        assert!(descr_err("'<U9999999999999999999'").contains("overflow"));
        assert!(descr_err("'<M8[lightyears]'").contains("unit"));
        assert!(descr_err("'<f4x'").contains("unexpected"));
        assert!(descr_err("[('a', '<f4'), ('a', '<f4')]").contains("duplicate"));
        assert!(descr_err("[('a', '<f8', (4294967296, 4294967296))]").contains("overflows"));
        assert!(descr_err("[('a',)]").contains("1 items"));
        assert!(descr_err("[('a', 5)]").contains("typestring"));
        assert!(descr_err("[('a', '<f4', ('x',))]").contains("not an integer"));
        assert!(descr_err("[(1, '<f4')]").contains("name"));
        assert!(descr_err("[('c', ('<f8', (-5,)), (2,))]").contains("negative dimension -5"));
        assert!(descr_err("[('c', '<f8', (2, -1))]").contains("negative dimension -1"));
        assert!(descr_err("[('c', '<f8', -2)]").contains("negative dimension -2"));
        assert!(descr_err("[('c', ('<f8',))]").contains("(format, shape) sub-array"));
        assert!(descr_err("[('c', ('<f8', (2**70,)))]").contains("malformed"));
        assert!(descr_err("[('c', ('<f8', (4294967296,)), (4294967296,))]").contains("overflows"));
        assert!(descr_err("5").contains("found an integer"));
        assert!(descr_err("{'a': 1}").contains("found a dict"));
        assert!(descr_err("[('a', '<f4')").contains("malformed literal at byte"));
        assert!(descr_err("'<f4").contains("malformed literal at byte 4"));
    }

    #[test]
    fn user_dtypes() {
        assert_eq!(user("u8"), ("'|u1'".into(), 1, vec![]));
        assert_eq!(user("i8"), ("'|i1'".into(), 1, vec![]));
        assert_eq!(user("<u8"), ("'<u8'".into(), 8, vec![]));
        assert_eq!(user("|u1"), ("'|u1'".into(), 1, vec![]));
        assert_eq!(user("f32"), ("'<f4'".into(), 4, vec![]));
        assert_eq!(user("float32"), ("'<f4'".into(), 4, vec![]));
        assert_eq!(user("uint16"), ("'<u2'".into(), 2, vec![]));
        assert_eq!(user("bool"), ("'|b1'".into(), 1, vec![]));
        assert_eq!(user("?"), ("'|b1'".into(), 1, vec![]));
        for (c, size) in [
            ("B", 1),
            ("b", 1),
            ("H", 2),
            ("h", 2),
            ("I", 4),
            ("i", 4),
            ("L", 8),
            ("l", 8),
            ("Q", 8),
            ("q", 8),
            ("e", 2),
            ("f", 4),
            ("d", 8),
        ] {
            assert_eq!(user(c).1, size, "{c}");
        }
        assert_eq!(user("3,31,31B"), ("'|u1'".into(), 1, vec![3, 31, 31]));
        assert_eq!(user(" 7f32 "), ("'<f4'".into(), 4, vec![7]));
        assert_eq!(user("2,2<f8"), ("'<f8'".into(), 8, vec![2, 2]));
        // numpy's parenthesised form, as in np.dtype('(2,5)<f4'), means the same as '2,5<f4'.
        assert_eq!(user("(2,5)<f4"), user("2,5<f4"));
        assert_eq!(user("(2,5)<f4"), ("'<f4'".into(), 4, vec![2, 5]));
        assert_eq!(user("( 2 , 5 ) u8"), ("'|u1'".into(), 1, vec![2, 5]));
        assert_eq!(user("(3,)B"), ("'|u1'".into(), 1, vec![3]));
        assert_eq!(user("()f32"), ("'<f4'".into(), 4, vec![]));
        assert_eq!(
            user("[('x', '<f4'), ('y', '|u1', (3,))]"),
            ("[('x', '<f4'), ('y', '|u1', (3,))]".into(), 7, vec![])
        );
    }

    #[test]
    fn rejected_user_dtypes() {
        let err = |s: &str| match parse_user_dtype(s) {
            Ok(d) => panic!("{s} accepted as {d:?}"),
            Err(e @ SourceError::DType { .. }) => e.to_string(),
            Err(e) => panic!("{s}: wrong variant {e:?}"),
        };
        for s in [
            "",
            "u7",
            "float",
            "uint128",
            "3,,3B",
            "3,31,31",
            "99999999999999999999B",
            "garbage",
            "(3,3B",
            "(3,x)B",
        ] {
            assert!(err(s).contains("expected a Rust name"), "{s}: {}", err(s));
        }
        assert!(err("u4").contains("without a byte order"));
        assert!(err("f8").contains("without a byte order"));
        assert!(err("(3,3)u1").contains("without a byte order"));
        for s in ["-3,4B", "(2,-5)<f4", "4,-1,2f32"] {
            assert!(err(s).contains("negative dimension -"), "{s}: {}", err(s));
        }
        assert!(err("i4,f8").contains("comma-separated structured"));
        assert!(err(">f4").contains("big-endian"));
        assert!(err("|O").contains("object"));
    }
}
