//! Rust errors as Python exceptions.
//!
//! The exception classes live in `pinfeed/errors.py` (pure Python, so that each can subclass
//! both `PinfeedError` and the matching builtin); this module picks the class for each error
//! variant and raises it with the Rust message, which names the file.
//!
//! | Rust error                                            | Python class                  |
//! |-------------------------------------------------------|-------------------------------|
//! | bad options, dtype, header, layout (`Config`, ...)    | `PinfeedValueError`           |
//! | an argument of the wrong type                         | `PinfeedTypeError`            |
//! | open, read, truncated file, threads (`Open`, ...)     | `PinfeedOSError` (`OSError`)  |
//! | budgets, host memory (`BudgetTooSmall`, ...)          | `PinfeedMemoryError`          |
//! | the CUDA driver, or no driver or device               | `CudaError` (`RuntimeError`)  |
//! | a transform's or a reader's failure, misuse of a pass | `PinfeedError`                |
//!
//! A runtime fault is never a `ValueError`: only configuration is.

use pinfeed::LoaderError;
use pinfeed_cuda::CudaError;
use pinfeed_source::SourceError;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyType;

/// Which `pinfeed.errors` class an error becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `PinfeedError`: nothing more specific fits.
    Base,
    /// `PinfeedValueError`: configuration, dtype, header, layout.
    Value,
    /// `PinfeedTypeError`: an argument of the wrong type.
    Type,
    /// `PinfeedOSError`: opening, reading, truncated files, threads.
    Os,
    /// `PinfeedMemoryError`: budgets and host memory.
    Memory,
    /// `CudaError`: the driver, or its absence.
    Cuda,
}

impl Kind {
    fn class_name(self) -> &'static str {
        match self {
            Kind::Base => "PinfeedError",
            Kind::Value => "PinfeedValueError",
            Kind::Type => "PinfeedTypeError",
            Kind::Os => "PinfeedOSError",
            Kind::Memory => "PinfeedMemoryError",
            Kind::Cuda => "CudaError",
        }
    }
}

/// A Rust error reduced to what Python needs: class, variant name, message, errno.
#[derive(Debug)]
pub(crate) struct Raised {
    pub(crate) kind: Kind,
    pub(crate) variant: &'static str,
    pub(crate) message: String,
    pub(crate) errno: Option<i32>,
    /// The driver libraries tried, for a missing driver (the exception's `tried`).
    pub(crate) tried: Vec<String>,
}

impl Raised {
    pub(crate) fn new(kind: Kind, variant: &'static str, message: impl Into<String>) -> Raised {
        Raised {
            kind,
            variant,
            message: message.into(),
            errno: None,
            tried: Vec::new(),
        }
    }

    /// The Python exception: an instance of the class for `kind`, with `.kind` set to the
    /// variant name and `.errno` to the OS error code where there is one.
    pub(crate) fn into_pyerr(self, py: Python<'_>) -> PyErr {
        let build = || -> PyResult<PyErr> {
            let class = py
                .import("pinfeed.errors")?
                .getattr(self.kind.class_name())?
                .cast_into::<PyType>()?;
            let value = class.call1((self.message.as_str(),))?;
            value.setattr("kind", self.variant)?;
            if !self.tried.is_empty() {
                // The library file names tried, for whoever needs more than the message.
                value.setattr("tried", self.tried.clone())?;
            }
            if let Some(errno) = self.errno {
                value.setattr("errno", errno)?;
            }
            Ok(PyErr::from_value(value))
        };
        // Only a broken installation (no `pinfeed.errors`) gets here; keep the message.
        build().unwrap_or_else(|_| PyRuntimeError::new_err(self.message))
    }
}

pub(crate) fn source_error(e: &SourceError) -> Raised {
    let (kind, variant, errno) = match e {
        SourceError::Open { source, .. } => (Kind::Os, "Open", source.raw_os_error()),
        SourceError::Read { source, .. } => (Kind::Os, "Read", source.raw_os_error()),
        SourceError::Truncated { .. } => (Kind::Os, "Truncated", None),
        SourceError::Write { source, .. } => (Kind::Os, "Write", source.raw_os_error()),
        SourceError::WriteCount { .. } => (Kind::Os, "WriteCount", None),
        // A file shorter than its header promises is a truncated file; a longer one is malformed.
        SourceError::DataSize {
            found, expected, ..
        } if found < expected => (Kind::Os, "DataSize", None),
        SourceError::DataSize { .. } => (Kind::Value, "DataSize", None),
        SourceError::Header { .. } => (Kind::Value, "Header", None),
        SourceError::FortranOrder { .. } => (Kind::Value, "FortranOrder", None),
        SourceError::DType { .. } => (Kind::Value, "DType", None),
        SourceError::Shape { .. } => (Kind::Value, "Shape", None),
        SourceError::Layout { .. } => (Kind::Value, "Layout", None),
        SourceError::RecordSize { .. } => (Kind::Value, "RecordSize", None),
        SourceError::Empty { .. } => (Kind::Value, "Empty", None),
        SourceError::NotNpy { .. } => (Kind::Value, "NotNpy", None),
        SourceError::OutOfRange { .. } => (Kind::Value, "OutOfRange", None),
        SourceError::Destination { .. } => (Kind::Value, "Destination", None),
        SourceError::Options { .. } => (Kind::Value, "Options", None),
        SourceError::Tensor { .. } => (Kind::Value, "Tensor", None),
        SourceError::Safetensors { .. } => (Kind::Value, "Safetensors", None),
        SourceError::ShardLayout { .. } => (Kind::Value, "ShardLayout", None),
        SourceError::NoShards { .. } => (Kind::Value, "NoShards", None),
        SourceError::Tokens { .. } => (Kind::Value, "Tokens", None),
        SourceError::Table { .. } => (Kind::Value, "Table", None),
        SourceError::Mixture { .. } => (Kind::Value, "Mixture", None),
        SourceError::TokenDtypeMissing { .. } => (Kind::Value, "TokenDtypeMissing", None),
        SourceError::Image { .. } => (Kind::Value, "Image", None),
        SourceError::ImageDataset { .. } => (Kind::Value, "ImageDataset", None),
        _ => (Kind::Base, "Source", None),
    };
    Raised {
        kind,
        variant,
        message: e.to_string(),
        errno,
        tried: Vec::new(),
    }
}

pub(crate) fn cuda_error(e: &CudaError) -> Raised {
    let (kind, variant, errno) = match e {
        CudaError::NoDriver { .. } => (Kind::Cuda, "NoDriver", None),
        CudaError::NoDevice { .. } => (Kind::Cuda, "NoDevice", None),
        CudaError::Driver { .. } => (Kind::Cuda, "Driver", None),
        CudaError::Forked { .. } => (Kind::Cuda, "Forked", None),
        CudaError::InvalidArgument { .. } => (Kind::Value, "InvalidArgument", None),
        CudaError::Unsupported { .. } => (Kind::Cuda, "Unsupported", None),
        CudaError::Os { source, .. } => (Kind::Memory, "Os", source.raw_os_error()),
        _ => (Kind::Cuda, "Cuda", None),
    };
    Raised {
        kind,
        variant,
        message: e.to_string(),
        errno,
        tried: e.tried().to_vec(),
    }
}

pub(crate) fn loader_error(e: &LoaderError) -> Raised {
    let (kind, variant, errno) = match e {
        LoaderError::Source(s) => return source_error(s),
        LoaderError::Cuda(c) => return cuda_error(c),
        LoaderError::Config(_) => (Kind::Value, "Config", None),
        LoaderError::BudgetTooSmall { .. } => (Kind::Memory, "BudgetTooSmall", None),
        LoaderError::HostMemory { source, .. } => {
            (Kind::Memory, "HostMemory", source.raw_os_error())
        }
        LoaderError::DeviceBudget { .. } => (Kind::Memory, "DeviceBudget", None),
        LoaderError::PinTooLarge { .. } => (Kind::Memory, "PinTooLarge", None),
        LoaderError::BatchTooLarge { .. } => (Kind::Memory, "BatchTooLarge", None),
        LoaderError::Worker { .. } => (Kind::Base, "Worker", None),
        LoaderError::Transform { .. } => (Kind::Base, "Transform", None),
        LoaderError::Thread { source, .. } => (Kind::Os, "Thread", source.raw_os_error()),
        LoaderError::Closed { .. } => (Kind::Base, "Closed", None),
        LoaderError::Io { source, .. } => (Kind::Os, "Io", source.raw_os_error()),
        LoaderError::Lock { source, .. } => (Kind::Memory, "Lock", source.raw_os_error()),
        _ => (Kind::Base, "Loader", None),
    };
    Raised {
        kind,
        variant,
        message: e.to_string(),
        errno,
        tried: Vec::new(),
    }
}

/// Converts errors of the Rust crates with `?` in functions returning `PyResult`.
pub(crate) trait ToPy<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> ToPy<T> for Result<T, LoaderError> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| loader_error(&e).into_pyerr(py))
    }
}

impl<T> ToPy<T> for Result<T, SourceError> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| source_error(&e).into_pyerr(py))
    }
}

impl<T> ToPy<T> for Result<T, Raised> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| e.into_pyerr(py))
    }
}

/// A `PinfeedValueError` with `message`.
pub(crate) fn value_error(
    py: Python<'_>,
    variant: &'static str,
    message: impl Into<String>,
) -> PyErr {
    Raised::new(Kind::Value, variant, message).into_pyerr(py)
}

/// A `PinfeedTypeError` with `message`.
pub(crate) fn type_error(py: Python<'_>, message: impl Into<String>) -> PyErr {
    Raised::new(Kind::Type, "Type", message).into_pyerr(py)
}
