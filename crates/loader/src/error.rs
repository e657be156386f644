use pinfeed_cuda::CudaError;
use pinfeed_source::SourceError;

/// Everything that can go wrong while building or running a [`Loader`](crate::Loader).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoaderError {
    /// The dataset could not be opened or read.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A CUDA driver call failed, or there is no driver or device.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// An option is out of range, or an argument does not fit what it is used with; the
    /// message says which and why. Only for what the caller can fix by asking differently:
    /// faults met while running have variants of their own.
    #[error("{0}")]
    Config(String),
    /// The pinned budget cannot hold the two slots the ring needs.
    #[error(
        "pinned budget of {budget} bytes holds {fits} slot(s) of {slot_bytes} bytes \
         ({batch_size} records of {record_bytes} bytes); pinfeed needs at least 2 to overlap \
         reading with copying: raise the pinned budget to at least {needed} bytes or lower the batch size"
    )]
    BudgetTooSmall {
        /// The budget the user set.
        budget: usize,
        /// Bytes in one slot.
        slot_bytes: usize,
        /// Slots that fit in the budget.
        fits: usize,
        /// Records in one batch.
        batch_size: usize,
        /// Bytes in one record.
        record_bytes: usize,
        /// The smallest budget that works.
        needed: usize,
    },
    /// Host memory could not be reserved for the ring.
    #[error("could not reserve {bytes} bytes of host memory for the pinned ring: {source}")]
    HostMemory {
        /// The size asked for.
        bytes: usize,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// More device memory would be held than the device budget allows.
    #[error(
        "device memory budget of {budget} bytes exceeded: {held} bytes are held by batches not yet \
         released and the next batch needs {wanted}; release batches sooner or raise the device budget"
    )]
    DeviceBudget {
        /// The budget.
        budget: usize,
        /// Bytes held now.
        held: usize,
        /// Bytes the next batch needs.
        wanted: usize,
    },
    /// Asked to page-lock more than the machine can spare (the seed's 68 GB `pin_memory()`).
    #[error(
        "refusing to page-lock {bytes} bytes: that is more than half of this machine's {total} bytes of \
         memory, and page-locked memory cannot be swapped out; stream it instead \
         (pinfeed.to_device or a Loader move any size through a fixed pinned budget)"
    )]
    PinTooLarge {
        /// Bytes asked for.
        bytes: u64,
        /// Memory of the machine.
        total: u64,
    },
    /// A thread of the loader or the stager panicked; the panic message is kept.
    #[error("the {thread} thread panicked: {message}")]
    Worker {
        /// Which thread: `reader`, `register lane`, ...
        thread: &'static str,
        /// The panic's message.
        message: String,
    },
    /// A part of the pipeline stopped before the work handed to it was done (it failed, or
    /// the loader is shutting down).
    #[error("the {what} has stopped")]
    Closed {
        /// What stopped.
        what: &'static str,
    },
    /// Reading or mapping a file failed while running.
    #[error("{}: {source}", pinfeed_source::escape_path(path))]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// Host memory could not be page-locked.
    #[error(
        "cannot page-lock {bytes} bytes: {source} (the memory-lock limit, `ulimit -l`, may be too low)"
    )]
    Lock {
        /// The size asked for.
        bytes: usize,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// A transform reported an error.
    #[error("transform failed on batch {seq}: {message}")]
    Transform {
        /// The batch's sequence number.
        seq: u64,
        /// What the transform said.
        message: String,
    },
    /// A batch larger than the memory of the device it is delivered to, refused before
    /// anything is allocated (allocating it would abort the process).
    #[error(
        "{name}: a batch of {records} records of {record_bytes} bytes is {bytes} bytes, more than \
         the {total} bytes of memory of device {device}; use a smaller batch size"
    )]
    BatchTooLarge {
        /// The source.
        name: String,
        /// Records in the largest batch.
        records: usize,
        /// Bytes of one delivered record.
        record_bytes: usize,
        /// Bytes of the largest batch.
        bytes: usize,
        /// Memory of the device.
        total: u64,
        /// The device, as `cpu` or `cuda:N`.
        device: String,
    },
    /// A thread could not be started.
    #[error("could not start the {what} thread: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// What the operating system said.
        source: std::io::Error,
    },
}

/// `Result` with a [`LoaderError`].
pub type Result<T, E = LoaderError> = std::result::Result<T, E>;

/// The message of a panic's payload (`&str` or `String`; anything else is "unknown panic").
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_faults_name_what_failed() {
        let worker = LoaderError::Worker {
            thread: "reader",
            message: "boom".into(),
        };
        assert_eq!(worker.to_string(), "the reader thread panicked: boom");
        let closed = LoaderError::Closed {
            what: "host copy engine",
        };
        assert_eq!(closed.to_string(), "the host copy engine has stopped");
        let io = LoaderError::Io {
            path: "/data/x.npy".into(),
            source: std::io::Error::from_raw_os_error(libc::EIO),
        };
        assert!(io.to_string().starts_with("/data/x.npy: "), "{io}");
        let payload: Box<dyn std::any::Any + Send> = Box::new(String::from("dynamic"));
        assert_eq!(panic_message(payload.as_ref()), "dynamic");
        let payload: Box<dyn std::any::Any + Send> = Box::new(7);
        assert_eq!(panic_message(payload.as_ref()), "unknown panic");
    }
}
