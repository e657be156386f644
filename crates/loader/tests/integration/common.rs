use std::sync::{Arc, Condvar, Mutex};

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

/// Every byte a host-backend loader delivers, in delivery order; the loader stays for its stats.
pub fn host_bytes(loader: &mut Loader) -> Vec<u8> {
    let mut bytes = Vec::new();
    for batch in loader.by_ref() {
        bytes.extend_from_slice(batch.expect("batch").host_bytes().unwrap().unwrap());
    }
    bytes
}

/// What a [`Faulty`] source does when asked for its bad record.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Fails the read with an I/O error.
    Error,
    /// Panics.
    Panic,
    /// Reads it, this much later.
    Delay(std::time::Duration),
    /// Reads it once the gate is opened: a test holds a read for as long as it looks.
    Wait(Arc<Gate>),
}

/// Holds [`Fault::Wait`] reads until [`Gate::open`].
#[derive(Debug, Default)]
pub struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    pub fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }

    fn wait(&self) {
        let open = self.open.lock().unwrap();
        drop(self.opened.wait_while(open, |open| !*open).unwrap());
    }
}

/// Wraps a source and fails, panics or is slow when asked for a given record.
#[derive(Debug)]
pub struct Faulty {
    pub inner: Arc<dyn Source>,
    pub bad_record: u64,
    pub fault: Fault,
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
            match &self.fault {
                Fault::Panic => panic!("injected panic at record {}", self.bad_record),
                Fault::Error => {
                    return Err(pinfeed_source::SourceError::Read {
                        path: "faulty source".into(),
                        offset: self.bad_record,
                        len: dst.len(),
                        source: std::io::Error::other("injected I/O error"),
                    })
                }
                Fault::Delay(delay) => std::thread::sleep(*delay),
                Fault::Wait(gate) => gate.wait(),
            }
        }
        self.inner.read_records(first, dst)
    }
}

/// 1000 random records of 16 bytes whose first record is `delay` slow to read (100 batches of
/// 10 records, the first one late), and the bytes.
pub fn slow_first_batch(delay: std::time::Duration) -> (Arc<Faulty>, Vec<u8>) {
    let (inner, data) = random_source(1000, 16, 7);
    let source = Arc::new(Faulty {
        inner,
        bad_record: 0,
        fault: Fault::Delay(delay),
    });
    (source, data)
}
