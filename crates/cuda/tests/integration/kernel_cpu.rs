//! The crop/resize kernel's source compiled as C++ and run on the CPU (no GPU needed) against
//! `crop_resize_reference`: crops (whole, and fractional windows of the whole image as a center
//! crop gives), flips, both layouts, uint8 and normalised float, shrinking and enlarging, with
//! and without antialias. Byte-identical: both sides do the same IEEE float
//! steps (no contraction). Needs a C++ compiler (`c++`, or `$CXX`).

use std::path::{Path, PathBuf};
use std::process::Command;

use pinfeed_cuda::nvjpeg::{crop_resize_reference, CropBox, Layout, OutputSpec, OutputType};

fn build(dir: &Path) -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let kernel = here.join("src/nvjpeg/crop_resize.cu");
    let exe = dir.join("kernel_on_cpu");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&cxx)
        .args(["-std=c++17", "-O1", "-ffp-contract=off", "-o"])
        .arg(&exe)
        .arg(format!("-DKERNEL=\"{}\"", kernel.display()))
        .arg(here.join("tests/integration/kernel_on_cpu.cpp"))
        .output()
        .unwrap_or_else(|e| panic!("running the C++ compiler `{cxx}` (set CXX): {e}"));
    assert!(
        out.status.success(),
        "{cxx} failed to build the kernel for the CPU:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

#[test]
fn the_kernel_run_on_the_cpu_matches_the_reference_byte_for_byte() {
    let dir = std::env::temp_dir().join(format!("pinfeed-kernel-cpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = build(&dir);
    let (w, h) = (77u32, 53u32);
    let src: Vec<u8> = (0..w * h * 3)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let input = dir.join("in.rgb");
    let output = dir.join("out.bin");
    std::fs::write(&input, &src).unwrap();
    let mean = [0.485, 0.456, 0.406];
    let std = [0.229, 0.224, 0.225];
    let mut cases = 0;
    let boxes = [
        (0, 0, 77, 53, None),
        (9, 10, 57, 39, None),
        (76, 52, 1, 1, None),
        (
            0,
            0,
            77,
            53,
            Some([15.523_81, 3.105_469, 46.385_4, 46.385_4]),
        ),
        (0, 0, 77, 53, Some([0.25, 0.5, 76.5, 52.125])),
    ];
    for (cx, cy, cw, ch, window) in boxes {
        for (oh, ow) in [(24, 40), (53, 77), (90, 7)] {
            for (flip, aa) in [(false, true), (true, false), (true, true)] {
                for (layout, f32) in [
                    (Layout::Nhwc, false),
                    (Layout::Nchw, false),
                    (Layout::Nchw, true),
                ] {
                    let dtype = if f32 {
                        OutputType::F32 { mean, std }
                    } else {
                        OutputType::U8
                    };
                    let spec = OutputSpec {
                        height: oh,
                        width: ow,
                        layout,
                        dtype,
                        antialias: aa,
                    };
                    let crop = CropBox {
                        x: cx,
                        y: cy,
                        width: cw,
                        height: ch,
                        window,
                    };
                    let mut want = vec![0u8; spec.image_bytes()];
                    crop_resize_reference(&src, w, h, crop, flip, &spec, &mut want).unwrap();
                    let [wx, wy, ww, wh] = crop.window_or_box().map(f32::to_bits);
                    let args = [
                        w,
                        h,
                        cx,
                        cy,
                        cw,
                        ch,
                        wx,
                        wy,
                        ww,
                        wh,
                        u32::from(flip),
                        oh,
                        ow,
                    ]
                    .map(|v| v.to_string())
                    .into_iter()
                    .chain([layout == Layout::Nchw, aa, f32].map(|b| u8::from(b).to_string()));
                    let status = Command::new(&exe)
                        .arg(&input)
                        .args(args)
                        .arg(&output)
                        .status()
                        .unwrap();
                    assert!(status.success(), "kernel_on_cpu: {status}");
                    let got = std::fs::read(&output).unwrap();
                    let case = format!("crop {crop:?} to {ow}x{oh} flip={flip} antialias={aa} {layout:?} f32={f32}");
                    assert!(got == want, "{case}: the kernel differs from the reference");
                    cases += 1;
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(cases, 135);
}
