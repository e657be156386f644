//! Token windows read at a wider dtype than they are stored in, so that sources of different
//! widths share one record layout (a mixture's sources).

use std::sync::Arc;

use super::{invalid, TokenDType};
use crate::{check_places, check_request, for_each_run, Layout, NetworkStats, Result, Source};

impl TokenDType {
    fn signed(self) -> bool {
        matches!(
            self,
            TokenDType::I8 | TokenDType::I16 | TokenDType::I32 | TokenDType::I64
        )
    }

    /// The narrowest dtype that holds every token of each of `dtypes` (the widest unsigned
    /// one when all are unsigned; a signed one wider than every unsigned one otherwise), or
    /// why there is none (uint64 beside a signed dtype).
    pub fn common(dtypes: &[TokenDType]) -> std::result::Result<TokenDType, String> {
        let widest = |signed: bool| {
            dtypes
                .iter()
                .filter(|d| d.signed() == signed)
                .map(|d| d.width())
                .max()
        };
        let (unsigned, signed) = (widest(false), widest(true));
        let (width, is_signed) = match (unsigned, signed) {
            (Some(u), None) => (u, false),
            (None, Some(s)) => (s, true),
            (Some(u), Some(s)) => (s.max(u * 2), true),
            (None, None) => return Err("no token dtype given".into()),
        };
        Ok(match (width, is_signed) {
            (1, false) => TokenDType::U8,
            (2, false) => TokenDType::U16,
            (4, false) => TokenDType::U32,
            (8, false) => TokenDType::U64,
            (1, true) => TokenDType::I8,
            (2, true) => TokenDType::I16,
            (4, true) => TokenDType::I32,
            (8, true) => TokenDType::I64,
            _ => {
                return Err(format!(
                    "no integer type holds both uint64 and signed tokens ({})",
                    dtypes
                        .iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            }
        })
    }
}

/// Windows of `from` tokens read as `to` tokens (at least as wide, holding every `from`
/// value): each record is read into the front of its place and widened there, back to front,
/// so no buffer is needed.
#[derive(Debug)]
pub struct Widened {
    inner: Arc<dyn Source>,
    from: TokenDType,
    to: TokenDType,
    layout: Layout,
}

impl Widened {
    /// `inner`'s windows of `from` tokens as `to` tokens; errors when `to` does not hold every
    /// `from` token.
    pub fn new(inner: Arc<dyn Source>, from: TokenDType, to: TokenDType) -> Result<Widened> {
        if TokenDType::common(&[from, to]).ok() != Some(to) {
            return Err(invalid(
                inner.name(),
                format!("{from} tokens cannot be read as {to}"),
            ));
        }
        let layout = Layout::new(to.dtype(), inner.layout().shape.clone())?;
        Ok(Widened {
            inner,
            from,
            to,
            layout,
        })
    }

    /// Widens `tokens` tokens at the front of `buf` in place.
    fn widen(&self, buf: &mut [u8], tokens: usize) {
        let (fw, tw) = (self.from.width(), self.to.width());
        for i in (0..tokens).rev() {
            let v = self.from.get(buf, i);
            // Two's complement little-endian bytes of `v`, cut to the wider width.
            buf[i * tw..(i + 1) * tw].copy_from_slice(&v.to_le_bytes()[..tw]);
        }
        debug_assert!(fw <= tw);
    }
}

impl Source for Widened {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn num_records(&self) -> u64 {
        self.inner.num_records()
    }

    fn read_records(&self, first: u64, dst: &mut [u8]) -> Result<()> {
        let count = check_request(self, first, dst.len())? as usize;
        let narrow = self.inner.layout().record_bytes();
        self.inner.read_records(first, &mut dst[..count * narrow])?;
        let tokens = count * narrow / self.from.width();
        self.widen(dst, tokens);
        Ok(())
    }

    fn gather_at(&self, records: &[(u64, usize)], dst: &mut [u8]) -> Result<()> {
        check_places(self, records, dst.len())?;
        let (narrow, wide) = (
            self.inner.layout().record_bytes(),
            self.layout.record_bytes(),
        );
        // Each run is read into the front of its own places and widened there: places not
        // named (another source's, in a mixture) are not touched.
        for_each_run(records.iter().copied(), |first, place, count| {
            let span = &mut dst[place * wide..(place + count) * wide];
            self.inner
                .read_records(first, &mut span[..count * narrow])?;
            self.widen(span, count * narrow / self.from.width());
            Ok(())
        })
    }

    fn reader_description(&self) -> String {
        format!(
            "{}, {} widened to {}",
            self.inner.reader_description(),
            self.from,
            self.to
        )
    }

    fn network(&self) -> Option<NetworkStats> {
        self.inner.network()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HostBuffer;

    fn windows(dtype: TokenDType, tokens: &[i64], window: u64) -> Arc<dyn Source> {
        let w = dtype.width();
        let data = tokens
            .iter()
            .flat_map(|v| v.to_le_bytes()[..w].to_vec())
            .collect();
        let layout = Layout::new(dtype.dtype(), vec![window]).unwrap();
        Arc::new(HostBuffer::from_vec(data, layout).unwrap())
    }

    #[test]
    fn common_dtypes_hold_every_token() {
        use TokenDType::*;
        assert_eq!(TokenDType::common(&[U16, U32]), Ok(U32));
        assert_eq!(TokenDType::common(&[U16, I16]), Ok(I32));
        assert_eq!(TokenDType::common(&[U8, I32, U16]), Ok(I32));
        assert_eq!(TokenDType::common(&[U32, I8]), Ok(I64));
        assert!(TokenDType::common(&[U64, I8]).is_err());
    }

    #[test]
    fn reads_and_gathers_widen_in_place() {
        let tokens: Vec<i64> = vec![1, 65535, 7, 300, 0, 65534];
        let w = Widened::new(
            windows(TokenDType::U16, &tokens, 2),
            TokenDType::U16,
            TokenDType::I32,
        )
        .unwrap();
        let mut buf = vec![0u8; 3 * 8];
        w.read_records(0, &mut buf).unwrap();
        let got: Vec<i128> = (0..6).map(|i| TokenDType::I32.get(&buf, i)).collect();
        assert_eq!(got, [1, 65535, 7, 300, 0, 65534]);
        let mut buf = vec![0xaau8; 4 * 8];
        w.gather_at(&[(2, 0), (0, 2), (1, 3)], &mut buf).unwrap();
        assert!(
            buf[8..16].iter().all(|&b| b == 0xaa),
            "a place not named was written"
        );
        let got: Vec<i128> = [0, 1, 4, 5, 6, 7]
            .iter()
            .map(|&i| TokenDType::I32.get(&buf, i))
            .collect();
        assert_eq!(got, [0, 65534, 1, 65535, 7, 300]);
        let signed = Widened::new(
            windows(TokenDType::I8, &[-1, 5], 2),
            TokenDType::I8,
            TokenDType::I64,
        )
        .unwrap();
        let mut buf = vec![0u8; 16];
        signed.read_records(0, &mut buf).unwrap();
        assert_eq!(TokenDType::I64.get(&buf, 0), -1);
        assert!(Widened::new(
            windows(TokenDType::U32, &[1, 2], 2),
            TokenDType::U32,
            TokenDType::I32
        )
        .is_err());
    }
}
