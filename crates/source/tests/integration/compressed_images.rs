//! Records for GPU decoding: the bitstream, the CPU path's draws and label for JPEGs the GPU
//! takes; the CPU path's record for the rest; bad input as the CPU path has it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pinfeed_source::images::{
    decode_rgb, CompressedImageSource, ImageIndex, ImageOptions, ImageSource, OnError,
    RecordHeader, RecordKind, DEFAULT_CAPACITY, DEFAULT_MAX_PIXELS, HEADER_BYTES,
};
use pinfeed_source::Source;

fn fixture(name: &str) -> Vec<u8> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images");
    std::fs::read(dir.join(name)).unwrap()
}

/// An ImageFolder of `files` (`class/name` from a fixture).
fn folder(dir: &Path, files: &[(&str, &str)]) -> PathBuf {
    let root = dir.join("train");
    for (rel, src) in files {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, fixture(src)).unwrap();
    }
    root
}

fn sources(
    root: &Path,
    options: ImageOptions,
    capacity: usize,
) -> (ImageIndex, CompressedImageSource) {
    let index = Arc::new(ImageIndex::open(root, false).unwrap());
    let images = ImageSource::new(index.clone(), options).unwrap();
    let compressed = CompressedImageSource::new(images, capacity).unwrap();
    (ImageIndex::open(root, false).unwrap(), compressed)
}

fn record(source: &dyn Source, i: u64) -> Vec<u8> {
    let mut record = vec![0u8; source.layout().record_bytes()];
    source.read_records(i, &mut record).unwrap();
    record
}

const FILES: &[(&str, &str)] = &[
    ("a/1.jpg", "baseline.jpg"),
    ("a/2.jpg", "progressive.jpg"),
    ("a/3.jpg", "grayscale.jpg"),
    ("b/4.jpg", "cmyk.jpg"),
    ("b/5.png", "rgb.png"),
    ("b/6.jpg", "tall.jpg"),
    ("b/7.jpg", "444.jpg"),
    ("c/8.jpg", "one_by_one.jpg"),
];

#[test]
fn jpeg_records_carry_the_bitstream_and_the_cpu_paths_draws_and_label() {
    let dir = tempfile::tempdir().unwrap();
    let root = folder(dir.path(), FILES);
    let options = ImageOptions {
        seed: 5,
        epoch: 2,
        ..ImageOptions::default()
    };
    let (index, source) = sources(&root, options, DEFAULT_CAPACITY);
    let cpu = source.images();
    assert_eq!(
        source.layout().record_bytes(),
        HEADER_BYTES + DEFAULT_CAPACITY
    );
    let mut kinds = Vec::new();
    for i in 0..source.num_records() {
        let rec = record(&source, i);
        let head = RecordHeader::parse(&rec).unwrap();
        let want_label = index.labels().nth(i as usize).unwrap();
        assert_eq!((head.place, head.label), (i, want_label), "record {i}");
        let payload = &rec[HEADER_BYTES..HEADER_BYTES + head.len];
        let name = FILES[i as usize].1;
        match head.kind {
            RecordKind::Jpeg => {
                assert_eq!(payload, fixture(name), "{name}: the bitstream, read once");
                let (w, h) = decode_rgb(payload, DEFAULT_MAX_PIXELS, &mut Vec::new()).unwrap();
                assert_eq!(head.image, (w, h), "{name}");
                assert_eq!((head.crop, head.flip), cpu.crop_of(i, w, h), "{name}");
            }
            RecordKind::Pixels => {
                assert_eq!(payload, record(cpu, i), "{name}: the CPU path's record");
            }
        }
        kinds.push(head.kind);
    }
    use RecordKind::{Jpeg, Pixels};
    // CMYK and PNG are the CPU's; every other JPEG (grayscale, progressive, 4:4:4, 1x1) the GPU's.
    assert_eq!(
        kinds,
        vec![Jpeg, Jpeg, Jpeg, Pixels, Pixels, Jpeg, Jpeg, Jpeg]
    );
}

#[test]
fn the_center_crop_and_the_draws_of_other_epochs_are_the_cpu_paths() {
    let dir = tempfile::tempdir().unwrap();
    let root = folder(dir.path(), &FILES[..3]);
    for options in [
        ImageOptions {
            crop: pinfeed_source::images::Crop::Center { resize: 256 },
            flip: false,
            ..ImageOptions::default()
        },
        ImageOptions {
            seed: 9,
            epoch: 7,
            ..ImageOptions::default()
        },
    ] {
        let (_, source) = sources(&root, options, DEFAULT_CAPACITY);
        for i in 0..3 {
            let head = RecordHeader::parse(&record(&source, i)).unwrap();
            let (w, h) = head.image;
            assert_eq!((head.crop, head.flip), source.images().crop_of(i, w, h));
        }
    }
}

#[test]
fn a_jpeg_larger_than_a_record_is_decoded_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let root = folder(dir.path(), &FILES[..1]);
    let options = ImageOptions {
        height: 16,
        width: 16,
        ..ImageOptions::default()
    };
    // Capacity 0 rounds up to the CPU path's record: 16 x 16 x 3 pixels and the label.
    let (_, small) = sources(&root, options.clone(), 0);
    assert_eq!(small.capacity(), 16 * 16 * 3 + 8);
    assert!(fixture("baseline.jpg").len() > small.capacity());
    let rec = record(&small, 0);
    let head = RecordHeader::parse(&rec).unwrap();
    assert_eq!(head.kind, RecordKind::Pixels);
    assert_eq!(&rec[HEADER_BYTES..], record(small.images(), 0));
    let (_, roomy) = sources(&root, options, DEFAULT_CAPACITY);
    assert_eq!(
        RecordHeader::parse(&record(&roomy, 0)).unwrap().kind,
        RecordKind::Jpeg
    );
}

#[test]
fn bad_samples_follow_the_cpu_paths_policy() {
    let dir = tempfile::tempdir().unwrap();
    let root = folder(
        dir.path(),
        &[
            ("a/1.jpg", "not_an_image.jpg"),
            ("a/2.jpg", "bomb.jpg"),
            ("a/3.jpg", "baseline.jpg"),
        ],
    );
    let (_, raising) = sources(&root, ImageOptions::default(), DEFAULT_CAPACITY);
    let mut rec = vec![0u8; raising.layout().record_bytes()];
    for (i, file) in [(0, "1.jpg"), (1, "2.jpg")] {
        let err = raising.read_records(i, &mut rec).unwrap_err().to_string();
        assert!(err.contains(file), "{err}");
    }
    let skip = ImageOptions {
        on_error: OnError::Skip,
        ..ImageOptions::default()
    };
    let (_, skipping) = sources(&root, skip, DEFAULT_CAPACITY);
    for i in 0..2 {
        let rec = record(&skipping, i);
        let head = RecordHeader::parse(&rec).unwrap();
        // The place is filled by the CPU path with the next sample that decodes.
        assert_eq!((head.kind, head.place), (RecordKind::Pixels, i));
        assert_eq!(
            &rec[HEADER_BYTES..HEADER_BYTES + head.len],
            record(skipping.images(), i)
        );
    }
    assert_eq!(
        skipping.images().skipped(),
        4,
        "each bad sample once per read"
    );
}

#[test]
fn a_truncated_jpeg_is_left_to_the_gpu_decoders_framing_check_and_the_cpu_path_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = folder(dir.path(), &[("a/t.jpg", "truncated.jpg")]);
    let (_, source) = sources(&root, ImageOptions::default(), DEFAULT_CAPACITY);
    let rec = record(&source, 0);
    // Its header reads, so its bytes travel; nvJPEG's framing check hands it back, and the CPU
    // path (the copy side's fallback) refuses it naming the file.
    let head = RecordHeader::parse(&rec).unwrap();
    assert_eq!(head.kind, RecordKind::Jpeg);
    let mut cpu = vec![0u8; source.images().layout().record_bytes()];
    let err = source
        .images()
        .read_records(0, &mut cpu)
        .unwrap_err()
        .to_string();
    assert!(err.contains("t.jpg"), "{err}");
}

#[test]
fn headers_that_the_source_did_not_write_are_refused() {
    assert!(RecordHeader::parse(&[0u8; 10])
        .unwrap_err()
        .contains("header"));
    let mut rec = vec![0u8; HEADER_BYTES + 4];
    let err = RecordHeader::parse(&rec).unwrap_err();
    assert!(err.contains("kind 0"), "{err}");
    rec[0] = 1;
    rec[4] = 5;
    let err = RecordHeader::parse(&rec).unwrap_err();
    assert!(err.contains("payload of 5 bytes"), "{err}");
    rec[4] = 4;
    assert_eq!(RecordHeader::parse(&rec).unwrap().len, 4);
}
