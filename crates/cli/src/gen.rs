//! `pinfeed gen`: a dataset of random records, written as a `.npy` file numpy reads.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use pinfeed_source::dtype::parse_user_dtype;
use pinfeed_source::npy::NpyWriter;
use pinfeed_source::Layout;
use rand::{Rng, RngCore, SeedableRng};

use crate::stream::record_shape;
use crate::Outcome;

#[derive(Args, Debug)]
pub struct GenArgs {
    /// Where to write the .npy file.
    out: PathBuf,
    /// Number of records.
    #[arg(long)]
    records: u64,
    /// Shape of one record, e.g. 3,31,31; a sub-array --dtype's dims come after it, as in numpy
    /// (--shape 4 --dtype 2,3B writes records of 4,2,3).
    #[arg(long, default_value = "3,31,31", value_parser = parse_shape)]
    shape: Shape,
    /// Element type: u8, i8, u16, i16, u32, i32, u64, i64, f16, f32, f64 (Rust names: u8 is one
    /// byte), or a numpy type string with its byte order such as <f4.
    #[arg(long, default_value = "u8")]
    dtype: String,
    /// Seed of the random generator; the same seed writes the same file.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Overwrite an existing file, or write through a symbolic link.
    #[arg(long)]
    force: bool,
}

/// The shape of one record (a newtype, so that clap takes it as one value).
#[derive(Clone, Debug)]
pub struct Shape(pub Vec<u64>);

/// Parses `3,31,31` (an empty string is a scalar record).
pub fn parse_shape(text: &str) -> Result<Shape, String> {
    if text.trim().is_empty() {
        return Ok(Shape(Vec::new()));
    }
    text.split(',')
        .map(|d| {
            d.trim()
                .parse::<u64>()
                .map_err(|_| format!("bad shape {text:?}: {d:?} is not a whole number"))
        })
        .collect::<Result<_, _>>()
        .map(Shape)
}

pub fn run(args: GenArgs) -> Result<Outcome> {
    let layout = parse_user_dtype(&args.dtype)
        .and_then(|(dtype, subarray)| {
            Layout::new(dtype, record_shape(Some(&args.shape.0), &subarray))
        })
        .with_context(|| format!("{}: --dtype/--shape", args.out.display()))?;
    if args.records == 0 {
        anyhow::bail!("{}: --records must be at least 1", args.out.display());
    }
    refuse_to_overwrite(&args)?;
    let mut writer = NpyWriter::create(&args.out, layout.clone(), args.records)?;
    let record_bytes = layout.record_bytes();
    let total = record_bytes as u128 * args.records as u128;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(args.seed);
    let mut chunk = vec![0u8; 8 << 20];
    let mut left = total;
    // Floats get values in [0, 1) so that they are finite numbers; everything else random bytes.
    let float = layout.dtype.descr.trim_matches('\'');
    while left > 0 {
        let n = left.min(chunk.len() as u128) as usize;
        let buf = &mut chunk[..n];
        match float {
            "<f4" => buf
                .chunks_exact_mut(4)
                .for_each(|c| c.copy_from_slice(&rng.random::<f32>().to_le_bytes())),
            "<f8" => buf
                .chunks_exact_mut(8)
                .for_each(|c| c.copy_from_slice(&rng.random::<f64>().to_le_bytes())),
            _ => rng.fill_bytes(buf),
        }
        writer
            .write(buf)
            .with_context(|| format!("writing {}", args.out.display()))?;
        left -= n as u128;
    }
    writer.finish()?;
    note!(
        "wrote {}: {} records of {} ({} bytes)",
        args.out.display(),
        args.records,
        layout_text(&layout),
        total
    );
    Ok(Outcome::Ok)
}

/// Without --force, an existing file or a symbolic link at the output path is an error (a
/// directory is left to the writer, which says so).
fn refuse_to_overwrite(args: &GenArgs) -> Result<()> {
    if args.force {
        return Ok(());
    }
    match std::fs::symlink_metadata(&args.out) {
        Ok(meta) if meta.file_type().is_symlink() => anyhow::bail!(
            "{} is a symbolic link: pass --force to write through it",
            args.out.display()
        ),
        Ok(meta) if !meta.is_dir() => anyhow::bail!(
            "{} already exists: pass --force to overwrite it",
            args.out.display()
        ),
        _ => Ok(()),
    }
}

fn layout_text(layout: &Layout) -> String {
    let dims: Vec<String> = layout.shape.iter().map(u64::to_string).collect();
    format!("{} [{}]", layout.dtype, dims.join(","))
}
