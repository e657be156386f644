//! Where an image dataset's samples are: the files of an ImageFolder tree, or the members of
//! WebDataset tar shards, each with its label. Built once at open; only the compressed bytes of
//! a sample are read later, by the reader threads.

use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::shards::{glob_match, is_pattern};
use crate::{escape_path, escape_text, Result, SourceError};

/// The file extensions an ImageFolder tree's images may have, compared without case: the list
/// torchvision's `ImageFolder` accepts (`torchvision.datasets.folder.IMG_EXTENSIONS`), so the
/// samples and labels are the ones torchvision finds. JPEG and PNG decode; the others are
/// refused by name when read.
pub const IMAGE_EXTENSIONS: &[&str] = &[
    "jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp",
];

/// The most bytes one image file (or tar member) may have: it is read whole into memory, so a
/// huge file, or a tar header claiming one, is refused instead.
pub const MAX_COMPRESSED_BYTES: u64 = 256 << 20;

/// The image members a WebDataset sample may have, and the label members.
const TAR_IMAGES: &[&str] = &["jpg", "jpeg", "png"];
const TAR_LABELS: &[&str] = &["cls", "json"];

/// Where one sample's compressed bytes are.
#[derive(Debug)]
enum Location {
    /// A file of an ImageFolder tree.
    File(PathBuf),
    /// `len` bytes at `offset` of tar shard `shard`, the member `name`.
    Member {
        shard: usize,
        offset: u64,
        len: u64,
        name: String,
    },
}

#[derive(Debug)]
struct Sample {
    location: Location,
    label: i64,
}

/// The samples of an image dataset in their fixed order (sorted as torchvision sorts an
/// ImageFolder tree; tar shards in name order, members in tar order), with their labels.
#[derive(Debug)]
pub struct ImageIndex {
    name: String,
    classes: Vec<String>,
    samples: Vec<Sample>,
    /// Tar shards, open for positioned reads.
    shards: Vec<(PathBuf, File)>,
    /// Problems met while indexing and skipped (empty class folders, unlabelled tar samples)
    /// when the caller asked to skip, one message each.
    skipped: Vec<String>,
}

impl ImageIndex {
    /// Indexes `path`: a tar shard (`*.tar`), a glob pattern of them, a directory holding only
    /// `.tar` files (WebDataset shards), or otherwise an ImageFolder tree (`path/<class>/...`).
    /// With `skip_bad`, an empty class folder or an unlabelled tar sample is noted in
    /// [`skipped`](ImageIndex::skipped) instead of refused.
    pub fn open(path: &Path, skip_bad: bool) -> Result<ImageIndex> {
        let name = escape_path(path);
        let meta = std::fs::metadata(path);
        let shards = if meta.as_ref().is_ok_and(|m| m.is_file()) {
            if path.extension().is_none_or(|e| e != "tar") {
                return Err(SourceError::ImageDataset {
                    name,
                    reason: "a file that is not a .tar shard: an image dataset is an \
                             ImageFolder directory (root/<class>/<image>) or WebDataset .tar \
                             shards"
                        .into(),
                });
            }
            Some(vec![path.to_path_buf()])
        } else if meta.is_err() && is_pattern(path) {
            Some(list_pattern(path)?)
        } else if meta.as_ref().is_ok_and(|m| m.is_dir()) {
            tar_directory(path)?
        } else {
            return Err(open_err(
                path,
                meta.err()
                    .unwrap_or_else(|| std::io::Error::other("not a directory")),
            ));
        };
        let mut index = ImageIndex {
            name,
            classes: Vec::new(),
            samples: Vec::new(),
            shards: Vec::new(),
            skipped: Vec::new(),
        };
        match shards {
            Some(shards) => index.add_shards(shards, skip_bad)?,
            None => index.add_folder(path, skip_bad)?,
        }
        if index.samples.is_empty() {
            return Err(SourceError::ImageDataset {
                name: index.name,
                reason: "no images found (expected an ImageFolder tree root/<class>/<image> or \
                         WebDataset .tar shards)"
                    .into(),
            });
        }
        Ok(index)
    }

    /// The dataset's name for messages: the path as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Samples in the dataset.
    pub fn len(&self) -> u64 {
        self.samples.len() as u64
    }

    /// Never true for an opened index (an empty dataset is refused); for clippy's `len` rule.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The class names of an ImageFolder tree, sorted: label `k` is `classes()[k]`. Empty for
    /// tar shards, whose labels are their own.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// The labels of every sample, in order.
    pub fn labels(&self) -> impl Iterator<Item = i64> + '_ {
        self.samples.iter().map(|s| s.label)
    }

    /// What was skipped while indexing (with `skip_bad`), one message each.
    pub fn skipped(&self) -> &[String] {
        &self.skipped
    }

    /// Sample `i`'s label.
    pub(crate) fn label(&self, i: u64) -> i64 {
        self.samples[i as usize].label
    }

    /// Sample `i`'s name in messages: its path, or `shard.tar:member`.
    pub fn sample_name(&self, i: u64) -> String {
        match &self.samples[i as usize].location {
            Location::File(path) => escape_path(path),
            Location::Member { shard, name, .. } => {
                format!(
                    "{}:{}",
                    escape_path(&self.shards[*shard].0),
                    escape_text(name)
                )
            }
        }
    }

    /// Reads sample `i`'s compressed bytes into `buf` (replacing what it held).
    pub(crate) fn read(&self, i: u64, buf: &mut Vec<u8>) -> Result<()> {
        buf.clear();
        match &self.samples[i as usize].location {
            Location::File(path) => {
                use std::io::Read;
                // By type first: a FIFO named like an image would block the read forever.
                let (file, size) = crate::read::open_regular(path)?;
                self.check_size(i, size)?;
                buf.reserve(size as usize);
                // At most one byte past the limit: a file that grows is refused, not read whole.
                let mut limited = file.take(MAX_COMPRESSED_BYTES + 1);
                limited.read_to_end(buf).map_err(|e| SourceError::Read {
                    path: path.clone(),
                    offset: buf.len() as u64,
                    len: usize::try_from(size.saturating_sub(buf.len() as u64)).unwrap_or(0),
                    source: e,
                })?;
                self.check_size(i, buf.len() as u64)?;
            }
            Location::Member {
                shard, offset, len, ..
            } => {
                self.check_size(i, *len)?;
                let (path, file) = &self.shards[*shard];
                buf.resize(*len as usize, 0);
                file.read_exact_at(buf, *offset).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        SourceError::Truncated {
                            path: path.clone(),
                            offset: *offset,
                            expected: *len,
                            found: 0,
                        }
                    } else {
                        SourceError::Read {
                            path: path.clone(),
                            offset: *offset,
                            len: *len as usize,
                            source: e,
                        }
                    }
                })?;
            }
        }
        Ok(())
    }

    /// Refuses sample `i` when its `size` bytes are more than any image is read whole for.
    fn check_size(&self, i: u64, size: u64) -> Result<()> {
        if size > MAX_COMPRESSED_BYTES {
            return Err(SourceError::Image {
                name: self.sample_name(i),
                reason: format!(
                    "{size} bytes, more than the {} MiB an image file may have",
                    MAX_COMPRESSED_BYTES >> 20
                ),
            });
        }
        Ok(())
    }

    /// The ImageFolder layout, as torchvision's `make_dataset` reads it: the sorted names of
    /// the root's sub-directories are the classes; each class's images are found by walking
    /// its folder (links followed), directories in sorted path order, files sorted by name.
    fn add_folder(&mut self, root: &Path, skip_bad: bool) -> Result<()> {
        let mut classes: Vec<PathBuf> = read_dir(root)?
            .into_iter()
            .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.is_dir()))
            .collect();
        classes.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
        if classes.is_empty() {
            return Err(SourceError::ImageDataset {
                name: self.name.clone(),
                reason: "no class folders (expected an ImageFolder tree root/<class>/<image>, or \
                         .tar shards)"
                    .into(),
            });
        }
        for (label, dir) in classes.iter().enumerate() {
            let mut found = Vec::new();
            walk(dir, &mut Vec::new(), &mut found)?;
            // By the bytes of the paths, as Python compares strings (code points, in the
            // order of their UTF-8 bytes); `Path`'s own order goes by components.
            found.sort_by(|a, b| {
                let key = |(d, f): &(PathBuf, PathBuf)| {
                    (
                        d.as_os_str().as_bytes().to_vec(),
                        f.as_os_str().as_bytes().to_vec(),
                    )
                };
                key(a).cmp(&key(b))
            });
            let before = self.samples.len();
            for (_, file) in found {
                self.samples.push(Sample {
                    location: Location::File(file),
                    label: label as i64,
                });
            }
            if self.samples.len() == before {
                // torchvision refuses an empty class; skipping keeps its label number.
                let empty = SourceError::ImageDataset {
                    name: escape_path(dir),
                    reason: format!(
                        "empty class folder: no file with an image extension ({})",
                        IMAGE_EXTENSIONS.join(", ")
                    ),
                };
                if !skip_bad {
                    return Err(empty);
                }
                self.skipped.push(empty.to_string());
            }
            let name = dir.file_name().unwrap_or_default();
            self.classes.push(name.to_string_lossy().into_owned());
        }
        Ok(())
    }

    fn add_shards(&mut self, shards: Vec<PathBuf>, skip_bad: bool) -> Result<()> {
        if shards.is_empty() {
            return Err(SourceError::ImageDataset {
                name: self.name.clone(),
                reason: "no .tar shards match".into(),
            });
        }
        for path in shards {
            let (file, _) = crate::read::open_regular(&path)?;
            let shard = self.shards.len();
            let members = tar_members(&path, &file)?;
            for group in group_by_key(&members) {
                match sample_of(&path, &file, shard, group) {
                    Ok(sample) => self.samples.push(sample),
                    Err(e) if skip_bad && matches!(e, SourceError::ImageDataset { .. }) => {
                        self.skipped.push(e.to_string())
                    }
                    Err(e) => return Err(e),
                }
            }
            self.shards.push((path, file));
        }
        Ok(())
    }
}

/// A tar member: name, data offset and length.
struct Member {
    name: String,
    offset: u64,
    len: u64,
}

/// The regular-file members of a tar shard, in tar order, read with the `tar` crate (which
/// seeks over the data: only headers are read).
fn tar_members(path: &Path, file: &File) -> Result<Vec<Member>> {
    let bad = |e: std::io::Error| SourceError::ImageDataset {
        name: escape_path(path),
        reason: format!("not a readable tar archive: {e}"),
    };
    let mut archive = tar::Archive::new(file);
    let mut members = Vec::new();
    for entry in archive.entries_with_seek().map_err(bad)? {
        let entry = entry.map_err(bad)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path().map_err(bad)?.to_string_lossy().into_owned();
        members.push(Member {
            name,
            offset: entry.raw_file_position(),
            len: entry.size(),
        });
    }
    Ok(members)
}

/// WebDataset's grouping: a member's key is its name up to the first dot of its last path
/// component, its extension the rest; consecutive members with one key are one sample.
fn group_by_key(members: &[Member]) -> Vec<&[Member]> {
    let mut groups = Vec::new();
    let mut start = 0;
    for i in 1..=members.len() {
        if i == members.len() || key(&members[i].name) != key(&members[start].name) {
            if start < i {
                groups.push(&members[start..i]);
            }
            start = i;
        }
    }
    groups
}

fn key(name: &str) -> &str {
    let base = name.rfind('/').map_or(0, |i| i + 1);
    name[base..]
        .find('.')
        .map_or(name, |dot| &name[..base + dot])
}

fn extension(name: &str) -> String {
    let base = name.rfind('/').map_or(0, |i| i + 1);
    name[base..].find('.').map_or(String::new(), |dot| {
        name[base + dot + 1..].to_ascii_lowercase()
    })
}

/// One WebDataset sample from its members: the image and the label it must have.
fn sample_of(path: &Path, file: &File, shard: usize, group: &[Member]) -> Result<Sample> {
    let key = key(&group[0].name);
    // Member names come from the archive: escaped in messages, as paths are.
    let refuse = |reason: String| SourceError::ImageDataset {
        name: format!("{}:{}", escape_path(path), escape_text(key)),
        reason,
    };
    let find = |wanted: &[&str]| {
        group
            .iter()
            .find(|m| wanted.contains(&extension(&m.name).as_str()))
    };
    let image = find(TAR_IMAGES)
        .ok_or_else(|| refuse("the sample has no .jpg, .jpeg or .png member".into()))?;
    let label = find(TAR_LABELS).ok_or_else(|| {
        refuse("the sample has no label (expected a .cls or .json member beside its image)".into())
    })?;
    if label.len > 4096 {
        return Err(refuse(format!(
            "its label member {} is {} bytes; a label is a small integer",
            escape_text(&label.name),
            label.len
        )));
    }
    let mut text = vec![0u8; label.len as usize];
    file.read_exact_at(&mut text, label.offset)
        .map_err(|e| SourceError::Read {
            path: path.to_path_buf(),
            offset: label.offset,
            len: text.len(),
            source: e,
        })?;
    let label_value = parse_label(&extension(&label.name), &text).ok_or_else(|| {
        refuse(format!(
            "cannot read the label of {}: expected an integer{} (found {:?})",
            escape_text(&label.name),
            if label.name.ends_with("json") {
                ", or an object with an integer \"label\""
            } else {
                ""
            },
            String::from_utf8_lossy(&text[..text.len().min(40)])
        ))
    })?;
    Ok(Sample {
        location: Location::Member {
            shard,
            offset: image.offset,
            len: image.len,
            name: image.name.clone(),
        },
        label: label_value,
    })
}

/// A `.cls` member's decimal integer, or a `.json` member's integer (alone, or as `"label"`
/// of an object).
fn parse_label(extension: &str, text: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(text).ok()?.trim();
    if extension == "cls" {
        return text.parse().ok();
    }
    match serde_json::from_str::<serde_json::Value>(text).ok()? {
        serde_json::Value::Number(n) => n.as_i64(),
        serde_json::Value::Object(o) => o.get("label")?.as_i64(),
        _ => None,
    }
}

fn open_err(path: &Path, source: std::io::Error) -> SourceError {
    SourceError::Open {
        path: path.to_path_buf(),
        source,
    }
}

fn read_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| open_err(dir, e))? {
        out.push(entry.map_err(|e| open_err(dir, e))?.path());
    }
    Ok(out)
}

/// Every file with an image extension under `dir` (links followed), as (the folder's path,
/// the file's path): sorting these pairs gives torchvision's order (`sorted(os.walk(...))`,
/// then sorted file names). `ancestors` holds the (device, inode) of the folders above `dir`: a
/// link back to one of them is refused, where `os.walk` would recurse until it fails.
fn walk(
    dir: &Path,
    ancestors: &mut Vec<(u64, u64)>,
    found: &mut Vec<(PathBuf, PathBuf)>,
) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(dir).map_err(|e| open_err(dir, e))?;
    let id = (meta.dev(), meta.ino());
    if ancestors.contains(&id) {
        return Err(SourceError::ImageDataset {
            name: escape_path(dir),
            reason: "a symbolic link loop: this folder links back to a folder above it".into(),
        });
    }
    ancestors.push(id);
    for path in read_dir(dir)? {
        let Ok(meta) = std::fs::metadata(&path) else {
            continue; // a broken link: torchvision's walk lists it, its loader fails; not an image
        };
        if meta.is_dir() {
            walk(&path, ancestors, found)?;
        } else if has_image_extension(&path) {
            found.push((dir.to_path_buf(), path));
        }
    }
    ancestors.pop();
    Ok(())
}

fn has_image_extension(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.as_bytes()).unwrap_or_default();
    IMAGE_EXTENSIONS.iter().any(|ext| {
        name.len() > ext.len()
            && name[name.len() - ext.len() - 1] == b'.'
            && name[name.len() - ext.len()..].eq_ignore_ascii_case(ext.as_bytes())
    })
}

/// A directory's `.tar` files, sorted, when it holds `.tar` files and no sub-directories;
/// `None` for anything else (an ImageFolder tree).
fn tar_directory(dir: &Path) -> Result<Option<Vec<PathBuf>>> {
    let mut tars = Vec::new();
    for path in read_dir(dir)? {
        if std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            return Ok(None);
        }
        if path.extension().is_some_and(|e| e == "tar") {
            tars.push(path);
        }
    }
    tars.sort();
    Ok((!tars.is_empty()).then_some(tars))
}

fn list_pattern(path: &Path) -> Result<Vec<PathBuf>> {
    let (Some(dir), Some(pattern)) = (path.parent(), path.file_name()) else {
        return Ok(Vec::new());
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let mut found: Vec<PathBuf> = read_dir(dir)?
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| glob_match(pattern.as_bytes(), n.as_bytes()))
        })
        .collect();
    found.sort();
    Ok(found)
}
