use std::sync::Arc;

use pinfeed::{DeviceSpec, Loader, LoaderOptions};
use pinfeed_source::dtype::parse_user_dtype;
use pinfeed_source::{HostBuffer, Layout, Source};
use rand::{RngCore, SeedableRng};

/// `n` random records of `record_bytes` bytes each, as a host-buffer source, and its bytes.
pub fn random_source(n: usize, record_bytes: usize, seed: u64) -> (Arc<dyn Source>, Vec<u8>) {
    let mut data = vec![0u8; n * record_bytes];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut data);
    let (dtype, _) = parse_user_dtype("u8").unwrap();
    let layout = Layout::new(dtype, vec![record_bytes as u64]).unwrap();
    let source = HostBuffer::from_vec(data.clone(), layout).unwrap();
    (Arc::new(source), data)
}

pub fn host_options(batch_size: usize) -> LoaderOptions {
    LoaderOptions {
        batch_size,
        device: DeviceSpec::Cpu,
        ..LoaderOptions::default()
    }
}

/// Everything a loader delivers, read back from the "device", in delivery order, with the
/// (epoch, first record, records) of each batch.
pub fn collect(loader: Loader) -> (Vec<u8>, Vec<(u64, u64, usize)>) {
    let mut bytes = Vec::new();
    let mut batches = Vec::new();
    for batch in loader {
        let batch = batch.expect("batch");
        let mut back = vec![0u8; batch.len_bytes()];
        batch.read_back(&mut back).unwrap();
        bytes.extend_from_slice(&back);
        batches.push((batch.epoch(), batch.first_record(), batch.num_records()));
    }
    (bytes, batches)
}

/// Wraps a source and fails (or panics) when asked for a given record.
#[derive(Debug)]
pub struct Faulty {
    pub inner: Arc<dyn Source>,
    pub bad_record: u64,
    pub panic: bool,
}

impl Source for Faulty {
    fn name(&self) -> &str {
        "faulty source"
    }
    fn layout(&self) -> &Layout {
        self.inner.layout()
    }
    fn num_records(&self) -> u64 {
        self.inner.num_records()
    }
    fn read_records(&self, first: u64, dst: &mut [u8]) -> pinfeed_source::Result<()> {
        let n = (dst.len() / self.layout().record_bytes()) as u64;
        if (first..first + n).contains(&self.bad_record) {
            if self.panic {
                panic!("injected panic at record {}", self.bad_record);
            }
            return Err(pinfeed_source::SourceError::Read {
                path: "faulty source".into(),
                offset: self.bad_record,
                len: dst.len(),
                source: std::io::Error::other("injected I/O error"),
            });
        }
        self.inner.read_records(first, dst)
    }
}

/// Wraps a source and takes `delay` longer over the read that holds a given record.
#[derive(Debug)]
pub struct Slow {
    pub inner: Arc<dyn Source>,
    pub slow_record: u64,
    pub delay: std::time::Duration,
}

impl Source for Slow {
    fn name(&self) -> &str {
        "slow source"
    }
    fn layout(&self) -> &Layout {
        self.inner.layout()
    }
    fn num_records(&self) -> u64 {
        self.inner.num_records()
    }
    fn read_records(&self, first: u64, dst: &mut [u8]) -> pinfeed_source::Result<()> {
        let n = (dst.len() / self.layout().record_bytes()) as u64;
        if (first..first + n).contains(&self.slow_record) {
            std::thread::sleep(self.delay);
        }
        self.inner.read_records(first, dst)
    }
}
