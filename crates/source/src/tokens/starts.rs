//! Where packed documents start in a window, by the rule `TokenLoader`'s text steps cut their
//! `segment_ids`, `position_ids` and `cu_seqlens` with: at a window's first input, at each
//! `bos` token and after each `eos` token. The reader threads count a batch's documents so,
//! and the consumer sizes `cu_seqlens` by that count without waiting for the device.

use super::TokenDType;

/// The ids that open (`bos`) and close (`eos`) each document of a stream of tokenized text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Boundaries {
    /// A document starts at each of these.
    pub bos: Option<u32>,
    /// A document starts after each of these.
    pub eos: Option<u32>,
}

impl Boundaries {
    /// Documents started or continued by the inputs (all but the last token) of each record
    /// of `records`, records of `window` tokens of `dtype` back to back, summed.
    pub fn documents(self, dtype: TokenDType, records: &[u8], window: usize) -> u64 {
        let bytes = window * dtype.width();
        let is = |id: Option<u32>, record: &[u8], i: usize| {
            id.is_some_and(|id| dtype.get(record, i) == i128::from(id))
        };
        records
            .chunks_exact(bytes)
            .map(|record| {
                let inner = (1..window - 1)
                    .filter(|&i| is(self.bos, record, i) || is(self.eos, record, i - 1))
                    .count();
                1 + inner as u64
            })
            .sum()
    }
}

/// Documents touched by the inputs of each document-window record of `records` (`window`
/// little-endian uint16 segment ordinals at `ids_at` in each `record_bytes`-byte record, as
/// [`DocumentWindows`](super::DocumentWindows) writes them): one, and one more wherever an
/// input's ordinal differs from the one before it.
pub(super) fn segmented(records: &[u8], record_bytes: usize, ids_at: usize, window: usize) -> u64 {
    let id = |r: &[u8], i: usize| u16::from_le_bytes([r[ids_at + 2 * i], r[ids_at + 2 * i + 1]]);
    records
        .chunks_exact(record_bytes)
        .map(|r| {
            1 + (1..window - 1)
                .filter(|&i| id(r, i) != id(r, i - 1))
                .count() as u64
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u32s(tokens: &[u32]) -> Vec<u8> {
        tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
    }

    #[test]
    fn a_document_starts_at_each_window_at_bos_and_after_eos_among_the_inputs() {
        // Two windows of 6 tokens (5 inputs and the last target); eos = 9, bos = 1.
        let records = u32s(&[5, 9, 7, 1, 9, 9, /* */ 1, 2, 3, 4, 5, 1]);
        let both = Boundaries {
            bos: Some(1),
            eos: Some(9),
        };
        // Window 0 starts documents at 0, after the eos at 1 and at the bos at 3; the eos at
        // input 4 closes one whose successor starts at the target. Window 1 starts one at 0
        // (at a bos too: once); its last bos is a target, not an input.
        assert_eq!(both.documents(TokenDType::U32, &records, 6), 3 + 1);
        let eos = Boundaries {
            bos: None,
            eos: Some(9),
        };
        assert_eq!(eos.documents(TokenDType::U32, &records, 6), 2 + 1);
        let bos = Boundaries {
            bos: Some(1),
            eos: None,
        };
        assert_eq!(bos.documents(TokenDType::U32, &records, 6), 2 + 1);
        assert_eq!(
            Boundaries::default().documents(TokenDType::U32, &records, 6),
            2
        );
        assert_eq!(both.documents(TokenDType::U32, &[], 6), 0);
    }

    #[test]
    fn segment_ordinals_count_each_change_among_the_inputs() {
        // Records of 2 bytes of tokens, then 5 uint16 ordinals (4 inputs and a target).
        let record = |ids: [u16; 5]| {
            let mut r = vec![0xAA, 0xBB];
            r.extend(ids.iter().flat_map(|i| i.to_le_bytes()));
            r
        };
        let mut records = record([0, 0, 1, 1, 2]);
        records.extend(record([0, 2, 2, 3, 3])); // a gap (an empty document) counts once
        records.extend(record([0, 0, 0, 0, 0]));
        assert_eq!(segmented(&records, 12, 2, 5), 2 + 3 + 1);
    }
}
