//! The GPU image path's formula against the CPU path's, on every machine: what `decode="gpu"`
//! does minus nvJPEG, composed on the CPU. Each record of a `CompressedImageSource` (what the
//! reader threads hand the copy thread) is decoded by zune-jpeg (nvJPEG's place), cropped with
//! the box `GpuImageDecode::crop_box` gives the kernel and resized, flipped and laid out by
//! `crop_resize_reference` (the kernel's arithmetic, step for step) under the decoder's
//! `output_spec`; the result must match the CPU path's record of the same sample within the
//! tolerance the GPU tests hold whole batches to (per channel: mean absolute difference under
//! 1, largest under 8). So a difference between the two formulas (geometry, filter, rounding)
//! fails here, where the GPU tests could only fail on a GPU.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pinfeed::GpuImageDecode;
use pinfeed_cuda::nvjpeg::{crop_resize_reference, JpegBackend};
use pinfeed_source::images::{
    decode_rgb, CompressedImageSource, Crop, ImageIndex, ImageOptions, ImageSource, PixelLayout,
    RecordHeader, RecordKind, DEFAULT_CAPACITY, HEADER_BYTES,
};
use pinfeed_source::Source;

/// A photograph-like `width` x `height` RGB image: smooth shading, hard-edged shapes, fine
/// stripes and noise (what makes resampling differences visible), from `seed`.
fn synthetic(width: u16, height: u16, seed: u32) -> Vec<u8> {
    let (w, h) = (f32::from(width), f32::from(height));
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    let mut noise = move || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        (state % 13) as f32 - 6.0
    };
    let mut out = Vec::with_capacity(usize::from(width) * usize::from(height) * 3);
    for y in 0..height {
        for x in 0..width {
            let (fx, fy) = (f32::from(x) / w, f32::from(y) / h);
            let disc = (fx - 0.4).powi(2) + (fy - 0.5).powi(2) < 0.06;
            let stripes = fx > 0.7 && (x / 3) % 2 == 0;
            let base = [
                60.0 + 150.0 * fx,
                40.0 + 170.0 * fy,
                200.0 - 120.0 * fx * fy,
            ];
            for (c, v) in base.into_iter().enumerate() {
                let v = if disc { 250.0 - 40.0 * c as f32 } else { v };
                let v = if stripes { v * 0.3 } else { v };
                out.push((v + noise()).clamp(0.0, 255.0) as u8);
            }
        }
    }
    out
}

fn encode(path: &Path, width: u16, height: u16, seed: u32, progressive: bool) {
    let mut bytes = Vec::new();
    let mut encoder = jpeg_encoder::Encoder::new(&mut bytes, 90);
    encoder.set_progressive(progressive);
    encoder
        .encode(
            &synthetic(width, height, seed),
            width,
            height,
            jpeg_encoder::ColorType::Rgb,
        )
        .unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// An ImageFolder of the JPEG fixtures (small photographs, upscaled by a 224 crop) and of
/// synthetic ImageNet-sized JPEGs (shrunk, so the antialiased filter is exercised).
fn folder(dir: &Path) -> PathBuf {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../source/tests/fixtures/images");
    let root = dir.join("train");
    for class in ["a", "b"] {
        std::fs::create_dir_all(root.join(class)).unwrap();
    }
    for name in [
        "baseline.jpg",
        "progressive.jpg",
        "grayscale.jpg",
        "444.jpg",
        "tall.jpg",
        "one_by_one.jpg",
    ] {
        std::fs::copy(fixtures.join(name), root.join("a").join(name)).unwrap();
    }
    for (k, (w, h, progressive)) in [
        (500, 375, false),
        (375, 500, true),
        (640, 480, false),
        (333, 500, false),
        (1024, 683, true),
        (230, 230, false),
    ]
    .into_iter()
    .enumerate()
    {
        encode(
            &root.join("b").join(format!("s{k}.jpg")),
            w,
            h,
            k as u32,
            progressive,
        );
    }
    root
}

/// Per channel (interleaved in HWC, planes in CHW): mean and largest absolute difference.
fn differences(got: &[u8], want: &[u8], chw: bool) -> [(f64, u8); 3] {
    let plane = got.len() / 3;
    std::array::from_fn(|c| {
        let diffs: Vec<u8> = (0..plane)
            .map(|p| {
                let at = if chw { c * plane + p } else { p * 3 + c };
                got[at].abs_diff(want[at])
            })
            .collect();
        let mean = diffs.iter().map(|&d| f64::from(d)).sum::<f64>() / plane as f64;
        (mean, diffs.into_iter().max().unwrap())
    })
}

/// Every sample of `root` under `options`, both ways; the samples that differ beyond the
/// tolerance, described, and how many went the GPU's way.
fn compare(root: &Path, options: ImageOptions) -> (Vec<String>, usize) {
    let index = Arc::new(ImageIndex::open(root, false).unwrap());
    let cpu = ImageSource::new(index.clone(), options.clone()).unwrap();
    let compressed = Arc::new(
        CompressedImageSource::new(ImageSource::new(index, options).unwrap(), DEFAULT_CAPACITY)
            .unwrap(),
    );
    let gpu = GpuImageDecode::new(Arc::clone(&compressed), JpegBackend::Auto);
    let spec = gpu.output_spec();
    let chw = cpu.output_form().2 == PixelLayout::Nchw;
    let mut record = vec![0u8; compressed.layout().record_bytes()];
    let mut want = vec![0u8; cpu.layout().record_bytes()];
    let (mut decoded, mut got) = (Vec::new(), vec![0u8; spec.image_bytes()]);
    let (mut failures, mut on_gpu) = (Vec::new(), 0);
    for i in 0..cpu.num_records() {
        compressed.read_records(i, &mut record).unwrap();
        let head = RecordHeader::parse(&record).unwrap();
        if head.kind != RecordKind::Jpeg {
            continue;
        }
        on_gpu += 1;
        let bitstream = &record[HEADER_BYTES..HEADER_BYTES + head.len];
        let (w, h) = decode_rgb(bitstream, u64::MAX, &mut decoded).unwrap();
        let crop = gpu.crop_box(&head, w, h);
        crop_resize_reference(&decoded, w, h, crop, head.flip, &spec, &mut got).unwrap();
        cpu.read_records(i, &mut want).unwrap();
        let diff = differences(&got, &want[..got.len()], chw);
        if diff.iter().any(|&(mean, max)| mean >= 1.0 || max >= 8) {
            failures.push(format!(
                "{} ({w}x{h}, box {crop:?}, flip {}): {diff:.3?}",
                index_name(&cpu, i),
                head.flip
            ));
        }
    }
    (failures, on_gpu)
}

fn index_name(source: &ImageSource, i: u64) -> String {
    source.index().sample_name(i)
}

fn assert_agree(root: &Path, options: ImageOptions) {
    let what = format!("{:?} {:?} {}", options.crop, options.layout, options.height);
    let (failures, on_gpu) = compare(root, options);
    assert!(
        on_gpu >= 11,
        "{what}: only {on_gpu} samples took the GPU's way"
    );
    assert!(
        failures.is_empty(),
        "{what}: {} of {on_gpu} images differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn random_resized_crops_agree_with_the_gpu_formula() {
    let dir = tempfile::tempdir().unwrap();
    let root = folder(dir.path());
    for (layout, size, seed) in [
        (PixelLayout::Nhwc, 224, 3),
        (PixelLayout::Nchw, 224, 11),
        (PixelLayout::Nhwc, 64, 5),
        (PixelLayout::Nchw, 160, 7),
    ] {
        for epoch in 0..3 {
            let options = ImageOptions {
                height: size,
                width: size,
                layout,
                seed,
                epoch,
                ..ImageOptions::default()
            };
            assert_agree(&root, options);
        }
    }
}

#[test]
fn center_crops_agree_with_the_gpu_formula() {
    let dir = tempfile::tempdir().unwrap();
    let root = folder(dir.path());
    for (layout, size, resize) in [
        (PixelLayout::Nhwc, 224, 256),
        (PixelLayout::Nchw, 224, 256),
        (PixelLayout::Nhwc, 64, 73),
        (PixelLayout::Nchw, 96, 96),
    ] {
        let options = ImageOptions {
            height: size,
            width: size,
            crop: Crop::Center { resize },
            layout,
            ..ImageOptions::default()
        };
        assert_agree(&root, options);
    }
}
