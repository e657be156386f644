//! `pinfeed stream --seq-len`: token data as windows of `seq_len + 1` tokens, and what
//! `--verify` holds each delivered window to.

use std::path::Path;

use anyhow::{bail, Result};
use pinfeed_source::tokens::{self, sampled_offset, Sample, TokenDType, TokenOptions, TokenSource};
use pinfeed_source::{Source, SourceError};

use crate::stream::StreamArgs;

/// How `args` pick windows: `--sample`, random by default as in nanoGPT.
pub fn sample(args: &StreamArgs) -> Sample {
    args.sample.unwrap_or(Sample::Random)
}

/// Opens the token data of `args` as windows of `seq_len + 1` tokens, `world_size` devices
/// splitting each step; refuses the options that do not apply to the sample asked for.
pub fn open(args: &StreamArgs, seq_len: u64, world_size: u64) -> Result<TokenSource> {
    let path = &args.path;
    let sample = sample(args);
    match sample {
        Sample::Random if args.shuffle != "none" => bail!(
            "--shuffle does not apply to --sample random: its windows are already at random \
             offsets"
        ),
        Sample::Random if args.epochs != 1 => {
            bail!("--epochs does not apply to --sample random: --steps sets its length")
        }
        Sample::Random if args.steps.is_none() => bail!(
            "{}: random windows never end: give --steps N (batches to stream), or --sample \
             sequential",
            path.display()
        ),
        Sample::Sequential | Sample::Documents if args.steps.is_some() => bail!(
            "--steps applies to --sample random only: {} windows end with the data",
            sample.name()
        ),
        _ => {}
    }
    let dtype = args
        .tokens
        .as_deref()
        .map(TokenDType::parse)
        .transpose()
        .map_err(|e| named(path, e))?;
    let options = TokenOptions {
        dtype,
        seq_len,
        sample,
        seed: args.seed,
        epoch: 0,
        steps: args.steps,
        batch_size: args.batch_size as u64,
        world_size,
        steps_per_batch: 1,
        shuffle: Default::default(),
    };
    let url = path.to_str().filter(|p| pinfeed_store::is_url(p));
    let opened = match url {
        Some(url) => {
            let (store, read) = crate::stream::store_options(args)?;
            pinfeed_store::open_tokens(url, dtype, &read, &store)
                .and_then(|stream| pinfeed_store::token_windows(stream.into(), &options))
        }
        None => tokens::open(path, &options),
    };
    opened.map_err(|e| {
        if matches!(e, SourceError::TokenDtypeMissing { .. }) {
            anyhow::anyhow!(
                "{}: a raw token file needs its token type: give --tokens (uint16 for nanoGPT's \
                 train.bin)",
                path.display()
            )
        } else {
            named(path, e)
        }
    })
}

/// `e`, led by the file's name unless its message already names the file or its index.
fn named(path: &Path, e: pinfeed_source::SourceError) -> anyhow::Error {
    let name = path.display().to_string();
    let message = e.to_string();
    if message.contains(&name) || message.contains(".idx") {
        e.into()
    } else {
        anyhow::Error::new(e).context(name)
    }
}

/// Fills `dst` with the bytes record `v` of `windows` must hold, worked out from the rule that
/// picks the window and read straight from the token data, not through the source's own read:
/// random windows at the offset drawn again with [`sampled_offset`], sequential window `v` at
/// token `v * seq_len`; document windows as the source reads window `v` of its plan (tokens,
/// then each token's segment ordinal), which `--verify` checks the delivery of, not the plan.
pub fn expected_record(
    windows: &TokenSource,
    v: u64,
    dst: &mut [u8],
) -> pinfeed_source::Result<()> {
    match windows {
        TokenSource::Random(s) => {
            let (seed, epoch) = s.seed_and_epoch();
            let num_offsets = s.stream().num_tokens() - s.seq_len();
            s.stream()
                .read_tokens(sampled_offset(seed, epoch, num_offsets, v), dst)
        }
        TokenSource::Sequential(s) => s.stream().read_tokens(v * s.seq_len(), dst),
        // The plan is the rule for document windows; the record is its tokens and segment ids.
        TokenSource::Documents(s) => s.read_records(v, dst),
    }
}
