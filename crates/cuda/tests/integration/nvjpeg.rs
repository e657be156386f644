//! nvJPEG decoding and the crop/resize kernel against references: Pillow's decode of the image
//! fixtures (`crates/source/tests/fixtures/images`, NAME.rgb beside NAME.jpg, made by
//! bench/lib/make_images.py) and `crop_resize_reference` run on the GPU's own decode.
//!
//! Each test prints what it checks (`--nocapture`), so a failure on the GPU machine says which
//! image, backend and channel went wrong.

use std::path::PathBuf;
use std::sync::Arc;

use pinfeed_cuda::nvjpeg::{
    crop_resize_reference, CropBox, DecoderOptions, ImageInfo, ImageRequest, JpegBackend,
    JpegDecoder, JpegOutcome, Layout, OutputSpec, OutputType,
};
use pinfeed_cuda::{
    memcpy_dtoh_async, memcpy_htod_async, Context, DevicePool, Event, PinMethod, PinnedMemory,
    Stream,
};

use crate::common::ctx;

/// Fixtures Pillow decodes to RGB, each with its `.rgb` reference.
const DECODABLE: [&str; 6] = [
    "baseline",
    "444",
    "progressive",
    "grayscale",
    "tall",
    "one_by_one",
];

fn fixture(name: &str) -> Vec<u8> {
    // Where the test was built, else below the current folder: the GPU machine runs the binary
    // from the root of a copy of the repository elsewhere.
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../source/tests/fixtures/images");
    let dir = match built.is_dir() {
        true => built,
        false => PathBuf::from("crates/source/tests/fixtures/images"),
    };
    let path = dir.join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// Pillow's RGB decode of `NAME.jpg`: (width, height, pixels).
fn reference(stem: &str) -> (u32, u32, Vec<u8>) {
    let raw = fixture(&format!("{stem}_jpg.rgb"));
    let w = u32::from_le_bytes(raw[0..4].try_into().unwrap());
    let h = u32::from_le_bytes(raw[4..8].try_into().unwrap());
    assert_eq!(raw.len(), 8 + (w * h * 3) as usize, "{stem}_jpg.rgb");
    (w, h, raw[8..].to_vec())
}

fn u8_spec(width: u32, height: u32, antialias: bool) -> OutputSpec {
    OutputSpec {
        height,
        width,
        layout: Layout::Nhwc,
        dtype: OutputType::U8,
        antialias,
    }
}

/// The backends to test on this device: always hybrid; auto (the hardware engines) when the
/// device has them.
fn backends(stream: &Stream, pool: &Arc<DevicePool>) -> Vec<JpegBackend> {
    let probe = JpegDecoder::new(
        stream,
        pool,
        u8_spec(8, 8, false),
        DecoderOptions::default(),
    )
    .unwrap_or_else(|e| panic!("JpegDecoder::new: {e}"));
    match probe.hardware() {
        Ok((engines, cores)) => {
            eprintln!("hardware JPEG decoder: {engines} engines, {cores} cores each");
            vec![JpegBackend::Hybrid, JpegBackend::Auto]
        }
        Err(why) => {
            eprintln!("no hardware JPEG decoder ({why}): testing the hybrid backend only");
            vec![JpegBackend::Hybrid]
        }
    }
}

/// A GPU and what a batch needs.
struct Rig {
    ctx: Arc<Context>,
    stream: Stream,
    pool: Arc<DevicePool>,
}

impl Rig {
    fn new() -> Rig {
        let ctx = ctx();
        let stream = Stream::new(&ctx).unwrap();
        let pool = DevicePool::new(&ctx).unwrap();
        Rig { ctx, stream, pool }
    }

    fn decoder(&self, spec: OutputSpec, backend: JpegBackend) -> JpegDecoder {
        let options = DecoderOptions {
            backend,
            ..DecoderOptions::default()
        };
        JpegDecoder::new(&self.stream, &self.pool, spec, options)
            .unwrap_or_else(|e| panic!("JpegDecoder::new({backend:?}): {e}"))
    }

    /// Decodes `files` as one batch from pinned memory (output prefilled with 0xAB) and returns
    /// the output bytes and outcomes.
    fn decode(
        &self,
        decoder: &mut JpegDecoder,
        files: &[Vec<u8>],
        flips: &[bool],
        crop: &mut dyn FnMut(usize, ImageInfo) -> CropBox,
    ) -> (Vec<u8>, Vec<JpegOutcome>) {
        let total: usize = files.iter().map(Vec::len).sum();
        let slot = PinnedMemory::alloc(&self.ctx, total.max(1), PinMethod::HostAlloc).unwrap();
        let mut requests = Vec::new();
        let mut at = 0;
        for (i, f) in files.iter().enumerate() {
            // SAFETY: `slot` holds `total` bytes; the ranges do not overlap; no copy runs yet.
            unsafe { std::ptr::copy_nonoverlapping(f.as_ptr(), slot.as_ptr().add(at), f.len()) };
            requests.push(ImageRequest {
                offset: at,
                len: f.len(),
                flip: flips[i],
            });
            at += f.len();
        }
        // SAFETY: `slot` is ours, `total` bytes long and initialised above.
        let bytes = unsafe { std::slice::from_raw_parts(slot.as_ptr(), total) };
        let out_len = files.len() * decoder.spec().image_bytes();
        let out = self.pool.alloc_async(out_len, &self.stream).unwrap();
        let fill = vec![0xABu8; out_len];
        let back = PinnedMemory::alloc(&self.ctx, out_len.max(1), PinMethod::HostAlloc).unwrap();
        let done = Event::new(&self.ctx).unwrap();
        let mut outcomes = Vec::new();
        // SAFETY: every buffer outlives the work, which `done.synchronize()` waits for; `out`
        // is `out_len` bytes of this context, used by nothing else. The decoder's stream is
        // `self.stream`, so the fill, the decode and the copy back are ordered.
        unsafe {
            memcpy_htod_async(out.ptr(), fill.as_ptr(), out_len, &self.stream).unwrap();
            decoder
                .decode_batch(
                    bytes,
                    &requests,
                    crop,
                    out.ptr(),
                    out_len,
                    &done,
                    &mut outcomes,
                )
                .unwrap_or_else(|e| panic!("decode_batch: {e}"));
            memcpy_dtoh_async(back.as_ptr(), out.ptr(), out_len, &self.stream).unwrap();
        }
        self.stream.synchronize().unwrap();
        assert!(done.query().unwrap());
        // SAFETY: the copy into `back` completed (synchronised above).
        let host = unsafe { std::slice::from_raw_parts(back.as_ptr(), out_len) }.to_vec();
        (host, outcomes)
    }
}

/// Mean and max absolute difference per channel of two RGB images.
fn channel_diff(a: &[u8], b: &[u8]) -> [(f64, u8); 3] {
    assert_eq!(a.len(), b.len());
    let mut out = [(0.0, 0u8); 3];
    for (c, o) in out.iter_mut().enumerate() {
        let (mut sum, mut max) = (0u64, 0u8);
        for (x, y) in a.iter().skip(c).step_by(3).zip(b.iter().skip(c).step_by(3)) {
            let d = x.abs_diff(*y);
            sum += u64::from(d);
            max = max.max(d);
        }
        *o = (sum as f64 / (a.len() / 3).max(1) as f64, max);
    }
    out
}

#[test]
#[ignore = "needs a CUDA device"]
fn decode_matches_pillow_within_idct_differences() {
    let rig = Rig::new();
    let mut failures = Vec::new();
    for backend in backends(&rig.stream, &rig.pool) {
        for stem in DECODABLE {
            let (w, h, want) = reference(stem);
            let mut decoder = rig.decoder(u8_spec(w, h, false), backend);
            let (got, outcomes) = rig.decode(
                &mut decoder,
                &[fixture(&format!("{stem}.jpg"))],
                &[false],
                &mut |_, info| {
                    assert_eq!((info.width, info.height), (w, h), "{stem}: header size");
                    CropBox::full(w, h)
                },
            );
            let diff = channel_diff(&got, &want);
            eprintln!(
                "{stem:12} {backend:?} -> {:?}: (mean, max) per channel {diff:?}",
                outcomes[0]
            );
            if !outcomes[0].decoded() {
                failures.push(format!(
                    "{stem} {backend:?}: not decoded: {:?}",
                    outcomes[0]
                ));
            } else if diff.iter().any(|(mean, max)| *mean >= 1.0 || *max >= 8) {
                failures.push(format!("{stem} {backend:?}: differs from Pillow: {diff:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[ignore = "needs a CUDA device"]
fn crop_resize_flip_match_the_cpu_reference_of_the_same_formula() {
    let rig = Rig::new();
    let files: Vec<Vec<u8>> = DECODABLE
        .iter()
        .map(|s| fixture(&format!("{s}.jpg")))
        .collect();
    let flips: Vec<bool> = (0..files.len()).map(|i| i % 2 == 1).collect();
    // A crop in each image's own pixels: an off-centre box of 3/4 of each side (the whole of a
    // 1x1 image); every third image a center crop's form instead, a fractional window of the
    // whole image.
    let pick = |i: usize, info: ImageInfo| {
        if i % 3 == 2 {
            let (w, h) = (info.width as f32, info.height as f32);
            return CropBox {
                window: Some([w * 0.13, h * 0.21, w * 0.7, h * 0.66]),
                ..CropBox::full(info.width, info.height)
            };
        }
        CropBox {
            x: info.width / 8,
            y: info.height / 5,
            width: (info.width * 3 / 4).max(1),
            height: (info.height * 3 / 4).max(1),
            window: None,
        }
    };
    for antialias in [true, false] {
        for (layout, dtype) in [
            (Layout::Nhwc, OutputType::U8),
            (Layout::Nchw, OutputType::U8),
            (
                Layout::Nchw,
                OutputType::F32 {
                    mean: [0.485, 0.456, 0.406],
                    std: [0.229, 0.224, 0.225],
                },
            ),
        ] {
            // 40x24: shrinks the 77x53 fixtures (antialias matters) and enlarges the 1x1 one.
            let spec = OutputSpec {
                height: 24,
                width: 40,
                layout,
                dtype,
                antialias,
            };
            let mut decoder = rig.decoder(spec, JpegBackend::Auto);
            let (got, outcomes) =
                rig.decode(&mut decoder, &files, &flips, &mut |i, info| pick(i, info));
            for (i, stem) in DECODABLE.iter().enumerate() {
                assert!(outcomes[i].decoded(), "{stem}: {:?}", outcomes[i]);
                // The GPU's own full-size decode of the same file, through the same backend.
                let (w, h, _) = reference(stem);
                let mut full = rig.decoder(u8_spec(w, h, false), JpegBackend::Auto);
                let (pixels, _) = rig.decode(&mut full, &files[i..=i], &[false], &mut |_, _| {
                    CropBox::full(w, h)
                });
                let info = ImageInfo {
                    width: w,
                    height: h,
                    components: 3,
                };
                let mut want = vec![0u8; spec.image_bytes()];
                crop_resize_reference(&pixels, w, h, pick(i, info), flips[i], &spec, &mut want)
                    .unwrap();
                let image = &got[i * spec.image_bytes()..(i + 1) * spec.image_bytes()];
                let worst = match dtype {
                    OutputType::U8 => image
                        .iter()
                        .zip(&want)
                        .map(|(a, b)| f64::from(a.abs_diff(*b)))
                        .fold(0.0, f64::max),
                    OutputType::F32 { .. } => floats(image)
                        .iter()
                        .zip(floats(&want))
                        .map(|(a, b)| f64::from((a - b).abs()))
                        .fold(0.0, f64::max),
                };
                eprintln!("{stem:12} antialias={antialias} {layout:?} {dtype:?} flip={}: max diff from the CPU reference {worst}", flips[i]);
                // The kernel is compiled without FMA contraction: the same float steps as the
                // reference, so the same bytes. One level of slack for a libm rounding edge.
                let limit = match dtype {
                    OutputType::U8 => 1.0,
                    OutputType::F32 { .. } => 1.0 / (255.0 * 0.224) + 1e-6,
                };
                assert!(
                    worst <= limit,
                    "{stem} antialias={antialias} {layout:?} {dtype:?}: max diff {worst}"
                );
            }
        }
    }
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
#[ignore = "needs a CUDA device"]
fn cmyk_truncated_non_jpeg_and_bombs_stay_off_the_gpu_and_their_output_untouched() {
    let rig = Rig::new();
    let names = [
        "cmyk.jpg",
        "baseline.jpg",
        "truncated.jpg",
        "not_an_image.jpg",
        "bomb.jpg",
        "rgb.png",
    ];
    let files: Vec<Vec<u8>> = names.iter().map(|n| fixture(n)).collect();
    let spec = u8_spec(16, 16, true);
    for backend in backends(&rig.stream, &rig.pool) {
        let mut decoder = rig.decoder(spec, backend);
        let (got, outcomes) = rig.decode(&mut decoder, &files, &[false; 6], &mut |_, info| {
            CropBox::full(info.width, info.height)
        });
        for (name, outcome) in names.iter().zip(&outcomes) {
            eprintln!("{name:18} {backend:?} -> {outcome:?}");
        }
        assert!(
            matches!(outcomes[0], JpegOutcome::Cpu { .. }),
            "cmyk: {:?}",
            outcomes[0]
        );
        assert!(outcomes[1].decoded(), "baseline: {:?}", outcomes[1]);
        assert!(
            matches!(outcomes[2], JpegOutcome::Cpu { .. }),
            "truncated: {:?}",
            outcomes[2]
        );
        assert!(
            matches!(outcomes[3], JpegOutcome::Cpu { .. }),
            "not an image: {:?}",
            outcomes[3]
        );
        assert!(
            matches!(outcomes[4], JpegOutcome::Refused { .. }),
            "bomb: {:?}",
            outcomes[4]
        );
        assert!(
            matches!(outcomes[5], JpegOutcome::Cpu { .. }),
            "png: {:?}",
            outcomes[5]
        );
        for (i, name) in names.iter().enumerate() {
            let image = &got[i * spec.image_bytes()..(i + 1) * spec.image_bytes()];
            if outcomes[i].decoded() {
                assert!(
                    image.iter().any(|b| *b != 0xAB),
                    "{name}: decoded but not written"
                );
            } else {
                assert!(
                    image.iter().all(|b| *b == 0xAB),
                    "{name}: not decoded but written"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_small_scratch_bound_decodes_in_parts_with_the_same_result() {
    let rig = Rig::new();
    let files: Vec<Vec<u8>> = DECODABLE
        .iter()
        .map(|s| fixture(&format!("{s}.jpg")))
        .collect();
    let flips = vec![false; files.len()];
    let spec = u8_spec(32, 32, true);
    let full = |_: usize, info: ImageInfo| CropBox::full(info.width, info.height);
    let mut roomy = rig.decoder(spec, JpegBackend::Auto);
    let (want, _) = rig.decode(&mut roomy, &files, &flips, &mut |i, info| full(i, info));
    // Room for one 77x53 image at a time.
    let options = DecoderOptions {
        max_pixels: 5_000,
        scratch_bytes: 15_360,
        ..DecoderOptions::default()
    };
    let mut tight = JpegDecoder::new(&rig.stream, &rig.pool, spec, options).unwrap();
    let (got, outcomes) = rig.decode(&mut tight, &files, &flips, &mut |i, info| full(i, info));
    assert!(outcomes.iter().all(JpegOutcome::decoded), "{outcomes:?}");
    assert!(got == want, "decoding in parts changed the output");
}

#[test]
#[ignore = "needs a CUDA device"]
fn steady_state_batches_allocate_no_device_memory() {
    let rig = Rig::new();
    let files: Vec<Vec<u8>> = DECODABLE
        .iter()
        .map(|s| fixture(&format!("{s}.jpg")))
        .collect();
    let flips = vec![true; files.len()];
    let mut decoder = rig.decoder(u8_spec(24, 24, true), JpegBackend::Auto);
    let mut first = None;
    let mut reserved = Vec::new();
    let mut free = Vec::new();
    for round in 0..30 {
        let (got, _) = rig.decode(&mut decoder, &files, &flips, &mut |_, info| {
            CropBox::full(info.width, info.height)
        });
        assert_eq!(
            *first.get_or_insert_with(|| got.clone()),
            got,
            "round {round} differs"
        );
        reserved.push(rig.pool.reserved_bytes().unwrap());
        free.push(rig.ctx.mem_info().unwrap().0);
    }
    eprintln!("pool bytes reserved by round: {reserved:?}");
    eprintln!("device bytes free by round: {free:?}");
    // nvJPEG's own buffers (allocated with cudaMalloc, outside the pool) stop growing too.
    assert!(
        free[3..].iter().all(|f| *f == free[3]),
        "device memory still changing after round 3: {free:?}"
    );
    // From the third round on the pool holds the same memory (the test's own output buffer is
    // freed and reallocated from it each round).
    assert!(
        reserved[2..].iter().all(|r| *r == reserved[2]),
        "{reserved:?}"
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn probe_reports_the_version_and_the_hardware_decoder() {
    let ctx = ctx();
    let p = pinfeed_cuda::nvjpeg::probe(&ctx).unwrap_or_else(|e| panic!("probe: {e}"));
    let name = ctx.name().unwrap();
    eprintln!(
        "{name}: nvJPEG {:?}, hardware decoder {:?}",
        p.version, p.hardware
    );
    assert!(p.version.0 >= 11, "{:?}", p.version);
    // The GPUs with JPEG engines that nvJPEG's hardware backend drives.
    if ["A100", "A30", "H100", "H200", "H800", "H20"]
        .iter()
        .any(|m| name.contains(m))
    {
        let (engines, cores) = p
            .hardware
            .unwrap_or_else(|e| panic!("{name} has JPEG engines: {e}"));
        assert!(engines > 0 && cores > 0, "{engines} engines, {cores} cores");
    }
}
