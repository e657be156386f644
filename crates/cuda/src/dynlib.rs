//! Finding and loading the CUDA libraries other than the driver (`libnvjpeg`, `libnvrtc`) at
//! run time, so that a machine without them still builds, loads and runs pinfeed's CPU paths.
//!
//! The driver is found by the system's loader (it lives beside the kernel module); these
//! libraries live in a toolkit folder or in a Python wheel (`nvidia-nvjpeg`,
//! `nvidia-cuda-nvrtc`), often on no loader path at all. So each candidate is tried in this
//! order, and every path tried is kept for the error:
//!
//! 1. the folders in `PINFEED_CUDA_LIBS` (colon-separated);
//! 2. the bare file names, through the system loader (`LD_LIBRARY_PATH`, the ld cache);
//! 3. `lib64` of `$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda` and `/usr/local/cuda-*`;
//! 4. the `nvidia/*/lib` folders of Python's package folders (`$VIRTUAL_ENV`, `$CONDA_PREFIX`,
//!    `PYTHONPATH`, `/usr/local/lib/python3.*`, `/usr/lib/python3*`, `~/.local/lib/python3.*`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::error::{CudaError, Result};

/// The environment variable naming extra folders to search first.
pub const LIBS_ENV: &str = "PINFEED_CUDA_LIBS";

/// Loads the first of `names` found in the places listed in the module docs.
///
/// `library` names it in the error ([`CudaError::LibraryMissing`]), which carries every path
/// tried and the loader's message for the last one that existed but failed to load.
pub(crate) fn load(library: &'static str, names: &[&str]) -> Result<libloading::Library> {
    let mut tried = Vec::new();
    let mut last_error = None;
    for candidate in candidates(names) {
        let shown = candidate.display().to_string();
        // A bare name goes to the system loader; a path is tried only if it exists, so that the
        // error keeps the message of a library that exists but failed to load.
        let bare = candidate.components().count() == 1;
        if !bare && !candidate.exists() {
            tried.push(shown);
            continue;
        }
        // SAFETY: loading runs the library's initialisers. These are NVIDIA's own libraries
        // (found by their file names), whose initialisers only set up their own state.
        match unsafe { libloading::Library::new(&candidate) } {
            Ok(lib) => return Ok(lib),
            Err(e) => {
                if !bare {
                    last_error = Some(format!("{shown}: {e}"));
                }
                tried.push(shown);
            }
        }
    }
    Err(CudaError::LibraryMissing {
        library,
        tried,
        last_error,
    })
}

/// A library's entry points once resolved, or what [`CudaError::LibraryMissing`] reports.
pub(crate) type Loaded<T> = std::result::Result<Arc<T>, (Vec<String>, Option<String>)>;

/// Loads `library` (the first of `names`) once per process into `cell`, resolving its entry
/// points with `resolve`; later calls answer from the cell, a failure included.
pub(crate) fn cached<T>(
    cell: &OnceLock<Loaded<T>>,
    library: &'static str,
    names: &[&str],
    resolve: impl FnOnce(libloading::Library) -> std::result::Result<T, String>,
) -> Result<Arc<T>> {
    let loaded = cell.get_or_init(|| {
        let lib = load(library, names).map_err(|e| match e {
            CudaError::LibraryMissing {
                tried, last_error, ..
            } => (tried, last_error),
            other => (Vec::new(), Some(other.to_string())),
        })?;
        resolve(lib)
            .map(Arc::new)
            .map_err(|e| (Vec::new(), Some(e)))
    });
    match loaded {
        Ok(api) => Ok(Arc::clone(api)),
        Err((tried, last_error)) => Err(CudaError::LibraryMissing {
            library,
            tried: tried.clone(),
            last_error: last_error.clone(),
        }),
    }
}

/// Every path (or bare name) to try, in order, without duplicates.
fn candidates(names: &[&str]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Ok(extra) = std::env::var(LIBS_ENV) {
        dirs.extend(
            extra
                .split(':')
                .filter(|d| !d.is_empty())
                .map(PathBuf::from),
        );
    }
    let mut out: Vec<PathBuf> = dirs
        .iter()
        .flat_map(|d| names.iter().map(move |n| d.join(n)))
        .collect();
    out.extend(names.iter().map(PathBuf::from));
    let mut later = toolkit_dirs();
    later.extend(python_dirs());
    for d in later {
        out.extend(names.iter().map(|n| d.join(n)));
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|p| seen.insert(p.clone()));
    out
}

/// The toolkit's library folders.
fn toolkit_dirs() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|v| std::env::var_os(v).map(PathBuf::from))
        .collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    roots.extend(subdirs(Path::new("/usr/local"), "cuda-"));
    roots
        .into_iter()
        .flat_map(|r| [r.join("lib64"), r.join("targets/x86_64-linux/lib")])
        .collect()
}

/// The `nvidia/<package>/lib` folders of Python's package folders (the wheels' layout:
/// `nvidia/cu13/lib` for CUDA 13, `nvidia/nvjpeg/lib` and `nvidia/cuda_nvrtc/lib` for 12).
fn python_dirs() -> Vec<PathBuf> {
    let mut site: Vec<PathBuf> = Vec::new();
    if let Ok(pp) = std::env::var("PYTHONPATH") {
        site.extend(pp.split(':').filter(|d| !d.is_empty()).map(PathBuf::from));
    }
    let mut prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(|v| std::env::var_os(v).map(PathBuf::from))
        .collect();
    prefixes.push(PathBuf::from("/usr/local"));
    prefixes.push(PathBuf::from("/usr"));
    if let Some(home) = std::env::var_os("HOME") {
        prefixes.push(PathBuf::from(home).join(".local"));
    }
    for prefix in prefixes {
        for py in subdirs(&prefix.join("lib"), "python3") {
            site.push(py.join("site-packages"));
            site.push(py.join("dist-packages"));
        }
    }
    site.into_iter()
        .flat_map(|s| subdirs(&s.join("nvidia"), ""))
        .map(|pkg| pkg.join("lib"))
        .collect()
}

/// The folders in `dir` whose names start with `prefix`, sorted (newest version last).
fn subdirs(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_start_with_the_bare_names_and_have_no_duplicates() {
        let c = candidates(&["libnvjpeg.so.13", "libnvjpeg.so"]);
        let bare: Vec<&PathBuf> = c.iter().filter(|p| p.components().count() == 1).collect();
        assert_eq!(bare.len(), 2, "{c:?}");
        assert!(c.contains(&PathBuf::from("/usr/local/cuda/lib64/libnvjpeg.so.13")));
        let unique: std::collections::HashSet<_> = c.iter().collect();
        assert_eq!(unique.len(), c.len());
    }

    #[test]
    fn a_missing_library_is_a_typed_error_naming_what_was_tried() {
        let e = load("libnotthere", &["libpinfeed-not-there.so.99"]).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("libnotthere"), "{msg}");
        assert!(msg.contains(LIBS_ENV), "{msg}");
        match e {
            CudaError::LibraryMissing { tried, .. } => {
                assert!(tried.iter().any(|t| t == "libpinfeed-not-there.so.99"));
                assert!(tried.len() > 1, "{tried:?}");
            }
            other => panic!("{other:?}"),
        }
    }
}
