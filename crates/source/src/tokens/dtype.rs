//! The integer dtypes tokens are stored in.

use std::fmt;

use crate::dtype::ScalarKind;
use crate::{DType, Result, SourceError};

/// An integer token dtype, little-endian. Tokens are read and copied at this width; widening
/// to int64 happens on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TokenDType {
    /// `uint8`.
    U8,
    /// `int8`.
    I8,
    /// `uint16`: nanoGPT's `train.bin`, Megatron's choice for vocabularies under 65 500.
    U16,
    /// `int16`.
    I16,
    /// `uint32`.
    U32,
    /// `int32`: Megatron's default.
    I32,
    /// `uint64`.
    U64,
    /// `int64`.
    I64,
}

impl TokenDType {
    /// Parses a dtype as `--dtype` takes one: `uint16`, `u16`, `<u2`, `int32`, ...
    pub fn parse(name: &str) -> Result<TokenDType> {
        // The crate's one dtype parser, so that a name means what it means for records: `u8`
        // is one byte (Rust's name), `<u8` eight (numpy's typestring, with its byte order).
        let (dtype, shape) = crate::dtype::parse_user_dtype(name)?;
        let refuse = |reason: String| SourceError::DType {
            path: None,
            descr: name.to_owned(),
            reason,
        };
        if !shape.is_empty() {
            return Err(refuse(format!(
                "a token is one integer, not a {shape:?} sub-array"
            )));
        }
        TokenDType::from_dtype(&dtype).map_err(|why| {
            refuse(format!(
                "{why}: tokens are integers (uint16, uint32, int32, uint8, int8, int16, uint64 \
                 or int64)"
            ))
        })
    }

    /// The token dtype of a `.npy` dtype, or why it is not one.
    pub(crate) fn from_dtype(dtype: &DType) -> std::result::Result<TokenDType, String> {
        let signed = match dtype.scalar_kind() {
            Some(ScalarKind::Int) => true,
            Some(ScalarKind::UInt) => false,
            _ => return Err(format!("tokens are integers, found {dtype}")),
        };
        Ok(match (dtype.itemsize, signed) {
            (1, false) => TokenDType::U8,
            (1, true) => TokenDType::I8,
            (2, false) => TokenDType::U16,
            (2, true) => TokenDType::I16,
            (4, false) => TokenDType::U32,
            (4, true) => TokenDType::I32,
            (8, false) => TokenDType::U64,
            (8, true) => TokenDType::I64,
            _ => return Err(format!("no integer of {} bytes", dtype.itemsize)),
        })
    }

    /// Bytes in one token.
    pub fn width(self) -> usize {
        match self {
            TokenDType::U8 | TokenDType::I8 => 1,
            TokenDType::U16 | TokenDType::I16 => 2,
            TokenDType::U32 | TokenDType::I32 => 4,
            TokenDType::U64 | TokenDType::I64 => 8,
        }
    }

    /// numpy's typestring, `<u2`.
    pub fn typestr(self) -> &'static str {
        match self {
            TokenDType::U8 => "|u1",
            TokenDType::I8 => "|i1",
            TokenDType::U16 => "<u2",
            TokenDType::I16 => "<i2",
            TokenDType::U32 => "<u4",
            TokenDType::I32 => "<i4",
            TokenDType::U64 => "<u8",
            TokenDType::I64 => "<i8",
        }
    }

    /// The element dtype of window records.
    pub fn dtype(self) -> DType {
        // Every typestring above is a valid little-endian integer descr.
        DType::from_descr_literal(&format!("'{}'", self.typestr()))
            .expect("integer typestrings parse")
    }

    /// Reads token `i` of little-endian `bytes` as an i128 (every token dtype fits), for tests
    /// and checks.
    pub fn get(self, bytes: &[u8], i: usize) -> i128 {
        let w = self.width();
        let b = &bytes[i * w..(i + 1) * w];
        match self {
            TokenDType::U8 => i128::from(b[0]),
            TokenDType::I8 => i128::from(b[0] as i8),
            TokenDType::U16 => i128::from(u16::from_le_bytes([b[0], b[1]])),
            TokenDType::I16 => i128::from(i16::from_le_bytes([b[0], b[1]])),
            TokenDType::U32 => i128::from(u32::from_le_bytes(b.try_into().unwrap_or_default())),
            TokenDType::I32 => i128::from(i32::from_le_bytes(b.try_into().unwrap_or_default())),
            TokenDType::U64 => i128::from(u64::from_le_bytes(b.try_into().unwrap_or_default())),
            TokenDType::I64 => i128::from(i64::from_le_bytes(b.try_into().unwrap_or_default())),
        }
    }
}

impl TokenDType {
    /// Every token dtype, in the order of [`TokenDType::code`].
    const ALL: [TokenDType; 8] = [
        TokenDType::U8,
        TokenDType::I8,
        TokenDType::U16,
        TokenDType::I16,
        TokenDType::U32,
        TokenDType::I32,
        TokenDType::U64,
        TokenDType::I64,
    ];

    /// A number from 1 to 8 for the dtype (0 stays free for "none"), for an atomic.
    pub(crate) fn code(self) -> u8 {
        Self::ALL.iter().position(|&t| t == self).unwrap_or(0) as u8 + 1
    }

    /// The dtype of [`TokenDType::code`] `code`; `None` for 0 or a number past them.
    pub(crate) fn from_code(code: u8) -> Option<TokenDType> {
        Self::ALL.get(usize::from(code).checked_sub(1)?).copied()
    }

    /// The smallest and largest value of the dtype.
    pub fn range(self) -> (i128, i128) {
        let bits = 8 * self.width() as u32;
        match self {
            TokenDType::U8 | TokenDType::U16 | TokenDType::U32 | TokenDType::U64 => {
                (0, (1i128 << bits) - 1)
            }
            _ => (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1),
        }
    }

    /// Whether every value of this dtype is a value of `out`.
    pub fn fits_in(self, out: TokenDType) -> bool {
        let ((lo, hi), (out_lo, out_hi)) = (self.range(), out.range());
        out_lo <= lo && hi <= out_hi
    }

    /// The index and value of the first of the little-endian tokens in `bytes` that `out`
    /// cannot hold, if any. The scan is one pass with no branch per token (the smallest and
    /// largest value), so it costs little beside the read it follows; only a batch holding such
    /// a token is looked at again, token by token.
    pub fn first_outside(self, bytes: &[u8], out: TokenDType) -> Option<(usize, i128)> {
        if self.fits_in(out) {
            return None;
        }
        let (out_lo, out_hi) = out.range();
        let (lo, hi): (i128, i128) = match self {
            TokenDType::U32 => {
                let max = words::<4>(bytes).map(u32::from_le_bytes).fold(0, u32::max);
                (0, max.into())
            }
            TokenDType::U64 => {
                let max = words::<8>(bytes).map(u64::from_le_bytes).fold(0, u64::max);
                (0, max.into())
            }
            TokenDType::I64 => {
                let (lo, hi) = words::<8>(bytes)
                    .map(i64::from_le_bytes)
                    .fold((i64::MAX, i64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
                (lo.into(), hi.into())
            }
            // Narrower dtypes only fail for outputs narrower than pinfeed widens to.
            _ => (out_lo - 1, out_hi + 1),
        };
        if lo >= out_lo && hi <= out_hi {
            return None;
        }
        (0..bytes.len() / self.width())
            .map(|i| (i, self.get(bytes, i)))
            .find(|&(_, v)| v < out_lo || v > out_hi)
    }
}

/// The `N`-byte words of `bytes` (a partial last one is left out).
fn words<const N: usize>(bytes: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    bytes
        .chunks_exact(N)
        .map(|c| c.try_into().unwrap_or([0; N]))
}

impl fmt::Display for TokenDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TokenDType::U8 => "uint8",
            TokenDType::I8 => "int8",
            TokenDType::U16 => "uint16",
            TokenDType::I16 => "int16",
            TokenDType::U32 => "uint32",
            TokenDType::I32 => "int32",
            TokenDType::U64 => "uint64",
            TokenDType::I64 => "int64",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_numpy_dtypes() {
        for name in [
            "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
        ] {
            let t = TokenDType::parse(name).unwrap();
            assert_eq!(t.to_string(), name);
            assert_eq!(t.dtype().to_string(), name);
            assert_eq!(t.dtype().itemsize, t.width());
            assert_eq!(TokenDType::from_dtype(&t.dtype()), Ok(t));
            assert_eq!(TokenDType::parse(t.typestr()).unwrap(), t);
        }
        assert!(TokenDType::parse("float32").is_err());
        // Names mean what they mean for records: `u8` is one byte, `<u8` numpy's eight.
        assert_eq!(TokenDType::parse("u8").unwrap(), TokenDType::U8);
        assert_eq!(TokenDType::parse("u16").unwrap(), TokenDType::U16);
        assert_eq!(TokenDType::parse("<u8").unwrap(), TokenDType::U64);
        assert!(
            TokenDType::parse("3B").is_err(),
            "a sub-array is not a token"
        );
        let f4 = DType::from_descr_literal("'<f4'").unwrap();
        assert!(TokenDType::from_dtype(&f4).unwrap_err().contains("float32"));
    }

    #[test]
    fn tokens_an_output_cannot_hold_are_found() {
        use TokenDType::*;
        assert!(U32.fits_in(I64) && I32.fits_in(I32) && U16.fits_in(I32));
        assert!(!U32.fits_in(I32) && !U64.fits_in(I64) && !I64.fits_in(I32));
        let u32s = |v: &[u32]| v.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(U32.first_outside(&u32s(&[1, (1 << 31) - 1]), I32), None);
        let bytes = u32s(&[5, 1 << 31, 7, u32::MAX]);
        assert_eq!(U32.first_outside(&bytes, I32), Some((1, 1 << 31)));
        assert_eq!(U32.first_outside(&bytes, I64), None);
        let u64s: Vec<u8> = [3u64, 1 << 63]
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect();
        assert_eq!(U64.first_outside(&u64s, I64), Some((1, 1 << 63)));
        assert_eq!(U64.first_outside(&u64s, I32), Some((1, 1 << 63)));
        let i64s: Vec<u8> = [-1i64, -(1 << 31) - 1]
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect();
        assert_eq!(I64.first_outside(&i64s, I32), Some((1, -(1 << 31) - 1)));
        assert_eq!(I64.first_outside(&i64s, I64), None);
        for t in TokenDType::ALL {
            assert_eq!(TokenDType::from_code(t.code()), Some(t));
        }
        assert_eq!(TokenDType::from_code(0), None);
    }

    #[test]
    fn get_reads_little_endian_tokens() {
        let bytes = [0xff, 0xff, 0x01, 0x00];
        assert_eq!(TokenDType::U16.get(&bytes, 0), 65535);
        assert_eq!(TokenDType::I16.get(&bytes, 0), -1);
        assert_eq!(TokenDType::U16.get(&bytes, 1), 1);
        assert_eq!(TokenDType::U32.get(&bytes, 0), 0x0001_ffff);
    }
}
