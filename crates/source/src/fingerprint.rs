//! A hash of a dataset's contents, for telling a resume state which data it was saved on: two
//! files of the same size and layout give the same order, so only their bytes tell them apart.

use crate::rng::hash2;
use crate::{Result, Source};

/// Records read at most, spread evenly from the first to the last.
const SAMPLED_RECORDS: u64 = 16;
/// Bytes read at most: a few records of a source with large ones.
const SAMPLED_BYTES: u64 = 1 << 20;

/// A hash of `source`'s record layout, record count and up to 16 records spread evenly across
/// it (at most 1 MiB of them). The same data under another name, or split into other shards,
/// hashes the same; other data of the same size almost surely does not. It reads a few records,
/// so a caller that asks often keeps the answer.
pub fn data_fingerprint(source: &dyn Source) -> Result<u64> {
    let record = source.layout().record_bytes() as u64;
    let n = source.num_records();
    let count = SAMPLED_RECORDS
        .min(n)
        .min((SAMPLED_BYTES / record.max(1)).max(1));
    let mut buf = vec![0u8; record as usize];
    let mut h = hash2(0x7265_636f_7264_7366, hash2(record, n));
    for k in 0..count {
        let i = match count {
            1 => 0,
            _ => (u128::from(n - 1) * u128::from(k) / u128::from(count - 1)) as u64,
        };
        source.read_records(i, &mut buf)?;
        h = buf
            .chunks(8)
            .map(|c| {
                let mut word = [0u8; 8];
                word[..c.len()].copy_from_slice(c);
                u64::from_le_bytes(word)
            })
            .fold(hash2(h, i), hash2);
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, HostBuffer, Layout};

    fn host(bytes: Vec<u8>, record: u64) -> HostBuffer {
        HostBuffer::from_vec(bytes, Layout::new(DType::uint8(), vec![record]).unwrap()).unwrap()
    }

    #[test]
    fn the_same_data_hashes_the_same_and_other_data_of_its_size_not() {
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        let a = data_fingerprint(&host(data.clone(), 64)).unwrap();
        assert_eq!(a, data_fingerprint(&host(data.clone(), 64)).unwrap());
        let mut other = data.clone();
        other[4095] ^= 1; // the last record is always sampled
        assert_ne!(a, data_fingerprint(&host(other, 64)).unwrap());
        // The same bytes as other records are other data.
        assert_ne!(a, data_fingerprint(&host(data, 32)).unwrap());
    }

    #[test]
    fn large_records_are_sampled_within_the_byte_bound() {
        let data = vec![3u8; 3 << 20];
        let f = data_fingerprint(&host(data, 1 << 20)).unwrap();
        assert_ne!(f, 0);
    }
}
