//! GPU image decoding (`decode="gpu"`): refused clearly where it cannot run (CI), and on a GPU
//! (`--ignored`) batches that match the CPU path's: pixels within the IDCT's differences,
//! labels, order and resume identical.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pinfeed::decode_auto::decode_rates;
use pinfeed::{
    Batch, Decode, DeviceSpec, GpuImageDecode, Loader, LoaderError, LoaderOptions, Position,
    Shuffle,
};
use pinfeed_cuda::nvjpeg::JpegBackend;
use pinfeed_source::images::{
    CompressedImageSource, ImageIndex, ImageOptions, ImageSource, PixelLayout,
};

/// An ImageFolder of `copies` of each decodable fixture, in three classes.
fn folder(dir: &Path, copies: usize) -> PathBuf {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../source/tests/fixtures/images");
    let root = dir.join("train");
    let names = [
        "baseline.jpg",
        "progressive.jpg",
        "grayscale.jpg",
        "444.jpg",
        "tall.jpg",
        "cmyk.jpg",
        "rgb.png",
        "one_by_one.jpg",
    ];
    for k in 0..copies {
        for (j, name) in names.iter().enumerate() {
            let class = root.join(format!("c{}", (k + j) % 3));
            std::fs::create_dir_all(&class).unwrap();
            let ext = Path::new(name).extension().unwrap().to_str().unwrap();
            std::fs::copy(fixtures.join(name), class.join(format!("{k}_{j}.{ext}"))).unwrap();
        }
    }
    root
}

fn sources(root: &Path, options: ImageOptions) -> (Arc<ImageSource>, Arc<CompressedImageSource>) {
    let index = Arc::new(ImageIndex::open(root, false).unwrap());
    let cpu = ImageSource::new(index.clone(), options.clone()).unwrap();
    let compressed = CompressedImageSource::new(ImageSource::new(index, options).unwrap(), 0);
    (Arc::new(cpu), Arc::new(compressed.unwrap()))
}

fn gpu_options(source: &Arc<CompressedImageSource>, device: DeviceSpec) -> LoaderOptions {
    LoaderOptions {
        batch_size: 8,
        device,
        gpu_images: Some(Arc::new(GpuImageDecode::new(
            Arc::clone(source),
            JpegBackend::Auto,
        ))),
        ..LoaderOptions::default()
    }
}

#[test]
fn decode_gpu_without_a_cuda_device_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let (_, compressed) = sources(&folder(dir.path(), 1), ImageOptions::default());
    let err = Loader::new(
        compressed.clone(),
        gpu_options(&compressed, DeviceSpec::Cpu),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LoaderError::Config(_)), "{err:?}");
    assert!(
        text.contains("decode='gpu'") && text.contains("decode='cpu'"),
        "{text}"
    );
    assert!(text.contains("train"), "names the dataset: {text}");
}

#[test]
fn a_gpu_decoder_of_another_source_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (cpu, compressed) = sources(&folder(dir.path(), 1), ImageOptions::default());
    let err = Loader::new(cpu, gpu_options(&compressed, DeviceSpec::Cpu)).unwrap_err();
    assert!(err.to_string().contains("another source"), "{err}");
}

/// Per image of a batch: (pixels, label). CPU batches are records (pixels, padding, label);
/// GPU batches planar (images, then labels from `labels_offset`).
fn images_of(
    batch: &Batch,
    pixel_bytes: usize,
    label_at: usize,
    planar: bool,
) -> Vec<(Vec<u8>, i64)> {
    let mut bytes = vec![0u8; batch.len_bytes()];
    batch.read_back(&mut bytes).unwrap();
    let n = batch.num_records();
    let label = |at: usize| i64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    (0..n)
        .map(|i| {
            if planar {
                let px = bytes[i * pixel_bytes..(i + 1) * pixel_bytes].to_vec();
                (px, label(n * label_at + 8 * i))
            } else {
                let at = i * (label_at + 8);
                (bytes[at..at + pixel_bytes].to_vec(), label(at + label_at))
            }
        })
        .collect()
}

/// Mean and largest absolute difference per channel (interleaved in HWC, planes in CHW)
/// within the IDCT's differences, as the CPU path is held to Pillow's.
fn assert_close(what: &str, got: &[u8], want: &[u8], chw: bool) {
    let diffs: Vec<u8> = got.iter().zip(want).map(|(a, b)| a.abs_diff(*b)).collect();
    let plane = diffs.len() / 3;
    for c in 0..3 {
        let channel: Vec<u8> = if chw {
            diffs[c * plane..(c + 1) * plane].to_vec()
        } else {
            diffs.iter().copied().skip(c).step_by(3).collect()
        };
        let mean = channel.iter().map(|&d| f64::from(d)).sum::<f64>() / channel.len() as f64;
        let max = channel.iter().copied().max().unwrap();
        assert!(
            mean < 1.0 && max < 8,
            "{what} channel {c}: mean {mean:.3}, max {max}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_decoded_batches_match_the_cpu_paths() {
    let dir = tempfile::tempdir().unwrap();
    let root = folder(dir.path(), 6);
    for (layout, seed) in [(PixelLayout::Nhwc, 3), (PixelLayout::Nchw, 11)] {
        let options = ImageOptions {
            layout,
            seed,
            epoch: 1,
            ..ImageOptions::default()
        };
        let (cpu, compressed) = sources(&root, options);
        let (pix, label_at) = (cpu.pixel_bytes(), cpu.label_offset());
        let run = |start: Position| {
            let base = LoaderOptions {
                shuffle: Shuffle::Random,
                seed,
                start,
                ..gpu_options(&compressed, DeviceSpec::Cuda(0))
            };
            let gpu = Loader::new(compressed.clone(), base.clone()).unwrap();
            let cpu_loader = Loader::new(
                cpu.clone(),
                LoaderOptions {
                    gpu_images: None,
                    ..base
                },
            )
            .unwrap();
            let mut positions = Vec::new();
            for (g, c) in gpu.zip(cpu_loader) {
                let (g, c) = (g.unwrap(), c.unwrap());
                assert_eq!(g.records(), c.records(), "the same order");
                let got = images_of(&g, pix, label_at, true);
                let want = images_of(&c, pix, label_at, false);
                for (k, ((gp, gl), (cp, cl))) in got.iter().zip(&want).enumerate() {
                    assert_eq!(gl, cl, "batch {} image {k}: label", g.seq());
                    let what = format!("batch {} image {k} {layout:?}", g.seq());
                    assert_close(&what, gp, cp, layout == PixelLayout::Nchw);
                }
                positions.push(g.position_after());
            }
            positions
        };
        let positions = run(Position::default());
        assert_eq!(positions.len(), 6, "48 images in batches of 8");
        // A resumed run delivers the rest, matching again.
        let resumed = run(positions[2]);
        assert_eq!(resumed, positions[3..]);
    }
}

#[test]
fn a_dataset_too_small_to_time_is_said_so() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("train");
    std::fs::create_dir_all(root.join("c")).unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../source/tests/fixtures/images");
    for k in 0..3 {
        std::fs::copy(
            fixtures.join("baseline.jpg"),
            root.join(format!("c/{k}.jpg")),
        )
        .unwrap();
    }
    let index = Arc::new(ImageIndex::open(&root, false).unwrap());
    let base = LoaderOptions {
        batch_size: 8,
        ..LoaderOptions::default()
    };
    let err = decode_rates(&index, &ImageOptions::default(), 0, &base).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("3 images are too few") && text.contains("train"),
        "{text}"
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn auto_times_both_decoders_on_the_datasets_images() {
    let dir = tempfile::tempdir().unwrap();
    let root = folder(dir.path(), 6);
    let index = Arc::new(ImageIndex::open(&root, false).unwrap());
    let base = LoaderOptions {
        batch_size: 8,
        ..LoaderOptions::default()
    };
    let options = ImageOptions::default();
    let rates = decode_rates(&index, &options, 0, &base).unwrap();
    assert!(
        rates.cpu_images_per_s > 0.0 && rates.gpu_images_per_s > 0.0,
        "{rates:?}"
    );
    assert_eq!(
        (rates.images, rates.ordinal),
        (32, 0),
        "4 timed batches of 8"
    );
    // Kept: the next loader on the dataset reads the rates instead of timing again.
    assert_eq!(decode_rates(&index, &options, 0, &base).unwrap(), rates);
    let present = Decode::gpu_decoder_present();
    let (choice, why) = Decode::resolve("auto", DeviceSpec::Cuda(0), present, |n| {
        decode_rates(&index, &options, n, &base)
    })
    .unwrap();
    assert_eq!((choice, why), rates.choice());
    eprintln!("decode=\"auto\" on the fixtures: {}", rates.choice().1);
}
