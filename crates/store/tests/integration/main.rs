//! `pinfeed-store` against a real S3-compatible server: moto's, started on a free loopback
//! port by the test itself (`moto_server`, from `moto[server]` in requirements-dev.txt) and
//! killed when the test ends. Objects are uploaded with `object_store` itself.

mod server;

use std::sync::Arc;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use pinfeed_source::npy::header_bytes;
use pinfeed_source::{dtype::parse_user_dtype, Layout, ReadOptions, Source};
use pinfeed_store::StoreOptions;

use server::Moto;

const RECORD: usize = 96;
const PER_SHARD: u64 = 500;

fn layout() -> Layout {
    let (dtype, sub) = parse_user_dtype("96B").unwrap();
    Layout::new(dtype, sub).unwrap()
}

/// Record `i`'s bytes: every byte a function of the record and its position.
fn record(i: u64) -> Vec<u8> {
    (0..RECORD as u64)
        .map(|j| (i * 31 + j * 7 + i / 256) as u8)
        .collect()
}

fn records(range: std::ops::Range<u64>) -> Vec<u8> {
    range.flat_map(record).collect()
}

fn options(moto: &Moto) -> StoreOptions {
    let mut o = StoreOptions::new();
    for pair in [
        format!("endpoint={}", moto.endpoint()),
        "allow_http=true".into(),
        "region=us-east-1".into(),
        "access_key_id=test".into(),
        "secret_access_key=test".into(),
    ] {
        o.set_pair(&pair).unwrap();
    }
    o
}

/// Uploads two `.npy` shards of `PER_SHARD` records and one raw file of both.
fn upload(moto: &Moto) {
    moto.create_bucket("data");
    let store: Arc<dyn ObjectStore> = Arc::new(
        object_store::aws::AmazonS3Builder::new()
            .with_endpoint(moto.endpoint())
            .with_allow_http(true)
            .with_region("us-east-1")
            .with_bucket_name("data")
            .with_access_key_id("test")
            .with_secret_access_key("test")
            .build()
            .unwrap(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let put = |key: &str, bytes: Vec<u8>| {
        rt.block_on(store.put(&ObjectPath::from(key), PutPayload::from(bytes)))
            .unwrap();
    };
    for s in 0..2 {
        let mut bytes = header_bytes(&layout(), PER_SHARD);
        bytes.extend(records(s * PER_SHARD..(s + 1) * PER_SHARD));
        put(&format!("train/part-{s}.npy"), bytes);
    }
    put("raw/all.bin", records(0..2 * PER_SHARD));
}

#[test]
fn shards_and_raw_objects_read_and_gather_byte_exact() {
    let moto = Moto::start();
    upload(&moto);
    let read = ReadOptions::default();
    let opts = options(&moto);
    let shards = pinfeed_store::open("s3://data/train/", None, &read, &opts).unwrap();
    let raw = pinfeed_store::open("s3://data/raw/all.bin", Some(layout()), &read, &opts).unwrap();
    for source in [&shards as &dyn Source, &raw] {
        assert_eq!(source.num_records(), 2 * PER_SHARD);
        let mut all = vec![0u8; 2 * PER_SHARD as usize * RECORD];
        source.read_records(0, &mut all).unwrap();
        assert_eq!(all, records(0..2 * PER_SHARD));
        // Across the shard boundary, out of order, with a repeat.
        let idx = [499u64, 500, 3, 4, 5, 999, 3, 250];
        let mut got = vec![0u8; idx.len() * RECORD];
        source.gather(&idx, &mut got).unwrap();
        let want: Vec<u8> = idx.iter().flat_map(|&i| record(i)).collect();
        assert_eq!(got, want);
    }
    let net = shards.network().unwrap();
    assert!(net.requests > 0 && net.bytes_fetched >= 2 * PER_SHARD * RECORD as u64);
    assert_eq!(net.retries, 0);
}

#[test]
fn a_gather_of_neighbours_is_one_request_and_the_cache_serves_it_again() {
    let moto = Moto::start();
    upload(&moto);
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(&moto);
    opts.cache_dir = Some(dir.path().join("cache"));
    opts.cache_limit = 1 << 30;
    let open = || {
        pinfeed_store::open(
            "s3://data/train/part-1.npy",
            None,
            &ReadOptions::default(),
            &opts,
        )
        .unwrap()
    };
    let source = open();
    // The header's read fetched the object's one (small) block whole and kept it.
    let opened = source.network().unwrap();
    assert_eq!((opened.cache_misses, opened.cache_hits), (1, 0));
    let idx: Vec<u64> = (0..100).step_by(2).collect();
    let mut got = vec![0u8; idx.len() * RECORD];
    source.gather(&idx, &mut got).unwrap();
    let want: Vec<u8> = idx.iter().flat_map(|&i| record(PER_SHARD + i)).collect();
    assert_eq!(got, want);
    let after = source.network().unwrap();
    assert_eq!((after.requests, after.cache_hits), (opened.requests, 1));
    // Another reader of the same cache (another process would do the same) sends one HEAD.
    let second = open();
    got.fill(0);
    second.gather(&idx, &mut got).unwrap();
    assert_eq!(got, want);
    let net = second.network().unwrap();
    assert_eq!((net.requests, net.cache_misses, net.cache_hits), (1, 0, 2));

    // Without a cache: 50 records, every other one, in one ranged GET (the gaps coalesced).
    let plain = pinfeed_store::open(
        "s3://data/train/part-1.npy",
        None,
        &ReadOptions::default(),
        &options(&moto),
    )
    .unwrap();
    let before = plain.network().unwrap().requests;
    plain.gather(&idx, &mut got).unwrap();
    assert_eq!(got, want);
    assert_eq!(plain.network().unwrap().requests - before, 1);
}

#[test]
fn a_token_file_in_a_bucket_streams_as_windows() {
    use pinfeed_source::tokens::{sampled_offset, Sample, TokenDType, TokenOptions};

    let moto = Moto::start();
    upload(&moto);
    // nanoGPT's train.bin: uint16 tokens back to back; here 20 000 of them.
    let tokens: Vec<u16> = (0..20_000u32).map(|i| (i * 7919 % 50_257) as u16).collect();
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let store: Arc<dyn ObjectStore> = Arc::new(
        object_store::aws::AmazonS3Builder::new()
            .with_endpoint(moto.endpoint())
            .with_allow_http(true)
            .with_region("us-east-1")
            .with_bucket_name("data")
            .with_access_key_id("test")
            .with_secret_access_key("test")
            .build()
            .unwrap(),
    );
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(store.put(&ObjectPath::from("tok/train.bin"), PutPayload::from(bytes)))
        .unwrap();
    let read = ReadOptions::default();
    let url = "s3://data/tok/train.bin";
    let e = pinfeed_store::open_tokens(url, None, &read, &options(&moto)).unwrap_err();
    assert!(
        matches!(e, pinfeed_source::SourceError::TokenDtypeMissing { .. }),
        "{e}"
    );
    let stream =
        pinfeed_store::open_tokens(url, Some(TokenDType::U16), &read, &options(&moto)).unwrap();
    assert_eq!(stream.num_tokens(), 20_000);
    let options = TokenOptions {
        dtype: Some(TokenDType::U16),
        seq_len: 64,
        sample: Sample::Sequential,
        seed: 0,
        epoch: 0,
        steps: None,
        batch_size: 8,
        world_size: 1,
        steps_per_batch: 1,
        shuffle: Default::default(),
    };
    let stream = Arc::new(stream);
    let documents = TokenOptions {
        sample: Sample::Documents,
        ..options.clone()
    };
    let e = pinfeed_store::token_windows(Arc::clone(&stream), &documents)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(&format!("{url}: documents sampling needs a Megatron")),
        "{e}"
    );
    // Random windows: a batch's ranged GETs go out together, each window at its own offset.
    let random = TokenOptions {
        sample: Sample::Random,
        steps: Some(4),
        ..options.clone()
    };
    let sampled = pinfeed_store::token_windows(Arc::clone(&stream), &random)
        .unwrap()
        .source();
    let mut got = vec![0u8; 32 * 65 * 2];
    sampled.read_records(0, &mut got).unwrap();
    for (v, window) in got.chunks_exact(65 * 2).enumerate() {
        let o = sampled_offset(0, 0, 20_000 - 64, v as u64) as usize;
        let want: Vec<u8> = tokens[o..o + 65]
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect();
        assert_eq!(window, want, "window {v} at {o}");
    }
    let windows = pinfeed_store::token_windows(stream, &options)
        .unwrap()
        .source();
    // Windows of 65 tokens every 64: window w is tokens 64w ..= 64w + 64.
    let mut got = vec![0u8; 3 * 65 * 2];
    windows.read_records(100, &mut got).unwrap();
    let want: Vec<u8> = (100 * 64..100 * 64 + 65)
        .chain(101 * 64..101 * 64 + 65)
        .chain(102 * 64..102 * 64 + 65)
        .flat_map(|i| tokens[i].to_le_bytes())
        .collect();
    assert_eq!(got, want);
    let net = windows
        .network()
        .expect("windows of a bucket report its network");
    assert!(net.requests > 0);
    assert!(windows.reader_description().starts_with("object store"));
}
