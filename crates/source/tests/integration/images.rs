//! Image datasets: decoded pixels against Pillow's (the fixtures' `.rgb` references, written by
//! bench/lib/make_images.py), ImageFolder and tar indexing, records, and every bad input.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pinfeed_source::images::{
    decode_rgb, Crop, ImageIndex, ImageOptions, ImageSource, OnError, PixelLayout,
    DEFAULT_MAX_PIXELS,
};
use pinfeed_source::{Source, SourceError};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images")
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(fixtures().join(name)).unwrap()
}

/// Pillow's `convert("RGB")` of a fixture: (width, height, pixels).
fn reference(name: &str) -> (u32, u32, Vec<u8>) {
    let stem = name.replace('.', "_");
    let raw = fixture(&format!("{stem}.rgb"));
    let w = u32::from_le_bytes(raw[..4].try_into().unwrap());
    let h = u32::from_le_bytes(raw[4..8].try_into().unwrap());
    (w, h, raw[8..].to_vec())
}

/// Mean and maximum absolute difference per channel.
fn differences(a: &[u8], b: &[u8]) -> [(f64, u8); 3] {
    assert_eq!(a.len(), b.len());
    std::array::from_fn(|c| {
        let diffs: Vec<u8> = a
            .iter()
            .zip(b)
            .skip(c)
            .step_by(3)
            .map(|(x, y)| x.abs_diff(*y))
            .collect();
        let mean = diffs.iter().map(|&d| f64::from(d)).sum::<f64>() / diffs.len() as f64;
        (mean, diffs.into_iter().max().unwrap())
    })
}

fn assert_close(name: &str, got: &[u8], want: &[u8]) {
    for (c, (mean, max)) in differences(got, want).into_iter().enumerate() {
        assert!(
            mean < 1.0 && max < 8,
            "{name} channel {c}: mean abs diff {mean:.3}, max {max} (Pillow's decode)"
        );
    }
}

const DECODABLE: &[&str] = &[
    "baseline.jpg",
    "progressive.jpg",
    "444.jpg",
    "grayscale.jpg",
    "cmyk.jpg",
    "one_by_one.jpg",
    "tall.jpg",
    "rgb.png",
    "grayscale.png",
    "palette.png",
    "rgba.png",
];

#[test]
fn decoded_pixels_match_pillow() {
    for name in DECODABLE {
        let mut out = Vec::new();
        let (w, h) = decode_rgb(&fixture(name), DEFAULT_MAX_PIXELS, &mut out)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let (rw, rh, want) = reference(name);
        assert_eq!((w, h), (rw, rh), "{name}");
        assert_close(name, &out, &want);
    }
}

#[test]
fn bad_images_are_refused_with_what_is_wrong() {
    let cases = [
        ("truncated.jpg", "corrupt or truncated JPEG"),
        ("not_an_image.jpg", "not a JPEG or PNG image"),
        (
            "bomb.jpg",
            "JPEG of 20000x20000 = 400000000 pixels, over the limit",
        ),
        (
            "bomb.png",
            "PNG of 20000x20000 = 400000000 pixels, over the limit",
        ),
    ];
    for (name, want) in cases {
        let mut out = Vec::new();
        let e = decode_rgb(&fixture(name), DEFAULT_MAX_PIXELS, &mut out).unwrap_err();
        assert!(e.contains(want), "{name}: {e}");
        assert!(!e.contains('\n'), "{name}: one line: {e}");
        // Nothing the size of the claimed image was allocated.
        assert!(out.capacity() < 1 << 20, "{name}: {} bytes", out.capacity());
    }
    let mut out = Vec::new();
    let e = decode_rgb(b"BM\0\0\0\0", DEFAULT_MAX_PIXELS, &mut out).unwrap_err();
    assert!(e.contains("BMP image; pinfeed decodes JPEG and PNG"), "{e}");
    assert!(decode_rgb(&fixture("baseline.jpg"), 77 * 53 - 1, &mut out).is_err());
}

/// An ImageFolder tree: classes `b_dogs` (two images, one in a sub-folder), `a_cats` (two),
/// with upper-case extensions and a file that is not an image by extension.
fn folder(dir: &Path, extra: &[(&str, &str)]) -> PathBuf {
    let root = dir.join("train");
    let put = |rel: &str, src: &str| {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, fixture(src)).unwrap();
    };
    put("b_dogs/z.JPEG", "baseline.jpg");
    put("b_dogs/sub/a.png", "rgb.png");
    put("a_cats/2.jpg", "progressive.jpg");
    put("a_cats/1.jpeg", "cmyk.jpg");
    put("a_cats/notes.txt", "not_an_image.jpg");
    for (rel, src) in extra {
        put(rel, src);
    }
    root
}

fn label_of(source: &ImageSource, record: &[u8]) -> i64 {
    let at = source.label_offset();
    i64::from_le_bytes(record[at..at + 8].try_into().unwrap())
}

fn read_all(source: &ImageSource) -> Vec<Vec<u8>> {
    let n = source.num_records();
    let mut all = vec![0u8; n as usize * source.layout().record_bytes()];
    source.read_records(0, &mut all).unwrap();
    all.chunks(source.layout().record_bytes())
        .map(<[u8]>::to_vec)
        .collect()
}

#[test]
fn image_folder_orders_and_labels_as_torchvision() {
    let dir = tempfile::tempdir().unwrap();
    let root = folder(dir.path(), &[]);
    let index = Arc::new(ImageIndex::open(&root, false).unwrap());
    assert_eq!(index.classes(), &["a_cats", "b_dogs"]);
    assert_eq!(index.labels().collect::<Vec<_>>(), vec![0, 0, 1, 1]);
    let source = ImageSource::new(index, ImageOptions::default()).unwrap();
    let records = read_all(&source);
    let labels: Vec<i64> = records.iter().map(|r| label_of(&source, r)).collect();
    assert_eq!(labels, vec![0, 0, 1, 1]);
    assert_eq!(source.layout().record_bytes(), 224 * 224 * 3 + 8);
    // Sorted within a class; torchvision sorts os.walk's folders ("b_dogs" before
    // "b_dogs/sub"), then the files of each.
    let names: Vec<String> = (0..4)
        .map(|i| {
            let name = source.index().sample_name(i);
            name[root.to_str().unwrap().len() + 1..].to_owned()
        })
        .collect();
    assert_eq!(
        names,
        [
            "a_cats/1.jpeg",
            "a_cats/2.jpg",
            "b_dogs/z.JPEG",
            "b_dogs/sub/a.png"
        ]
    );
    let e = source.gather(&[0], &mut [0; 8]).unwrap_err();
    assert!(matches!(e, SourceError::Destination { .. }));
}

#[test]
fn records_are_a_pure_function_of_seed_epoch_and_sample() {
    let dir = tempfile::tempdir().unwrap();
    let index = Arc::new(ImageIndex::open(&folder(dir.path(), &[]), false).unwrap());
    let opts = |epoch| ImageOptions {
        height: 32,
        width: 40,
        epoch,
        ..ImageOptions::default()
    };
    let a = ImageSource::new(index.clone(), opts(1)).unwrap();
    let b = ImageSource::new(index.clone(), opts(1)).unwrap();
    let c = ImageSource::new(index, opts(2)).unwrap();
    let all = read_all(&a);
    assert_eq!(all, read_all(&b));
    assert_ne!(all, read_all(&c));
    // A gather in any order gives each sample's own record.
    let rb = a.layout().record_bytes();
    let mut gathered = vec![0u8; 5 * rb];
    a.gather(&[3, 1, 1, 0, 2], &mut gathered).unwrap();
    for (k, i) in [3usize, 1, 1, 0, 2].into_iter().enumerate() {
        assert_eq!(gathered[k * rb..(k + 1) * rb], all[i][..], "place {k}");
    }
}

#[test]
fn an_identity_center_crop_is_the_decoded_image_and_layouts_agree() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("t");
    std::fs::create_dir_all(root.join("c")).unwrap();
    std::fs::write(root.join("c/x.jpg"), fixture("baseline.jpg")).unwrap();
    let index = Arc::new(ImageIndex::open(&root, false).unwrap());
    let opts = |layout, flip| ImageOptions {
        height: 53,
        width: 77,
        crop: Crop::Center { resize: 53 },
        flip,
        layout,
        ..ImageOptions::default()
    };
    let hwc = read_all(&ImageSource::new(index.clone(), opts(PixelLayout::Nhwc, false)).unwrap());
    let (_, _, want) = reference("baseline.jpg");
    assert_close("identity crop", &hwc[0][..want.len()], &want);
    let chw = read_all(&ImageSource::new(index.clone(), opts(PixelLayout::Nchw, false)).unwrap());
    let plane = 77 * 53;
    for (p, px) in hwc[0][..plane * 3].chunks(3).enumerate() {
        assert_eq!(
            [chw[0][p], chw[0][plane + p], chw[0][2 * plane + p]],
            [px[0], px[1], px[2]]
        );
    }
    // Center crops are not flipped at random unless asked; with flip, some seed flips it.
    let flipped = (0..16)
        .map(|seed| {
            let o = ImageOptions {
                seed,
                ..opts(PixelLayout::Nhwc, true)
            };
            read_all(&ImageSource::new(index.clone(), o).unwrap()).remove(0)
        })
        .find(|r| r != &hwc[0])
        .expect("one of 16 seeds flips");
    for (row, frow) in hwc[0][..plane * 3]
        .chunks(77 * 3)
        .zip(flipped[..plane * 3].chunks(77 * 3))
    {
        let mirrored: Vec<u8> = row.chunks(3).rev().flatten().copied().collect();
        assert_eq!(frow, &mirrored[..]);
    }
}

#[test]
fn a_bad_sample_raises_naming_the_file_or_is_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let root = folder(dir.path(), &[("a_cats/3.jpg", "truncated.jpg")]);
    let index = Arc::new(ImageIndex::open(&root, false).unwrap());
    let small = ImageOptions {
        height: 16,
        width: 16,
        ..ImageOptions::default()
    };
    let raising = ImageSource::new(index.clone(), small.clone()).unwrap();
    let rb = raising.layout().record_bytes();
    let e = raising.read_records(2, &mut vec![0; rb]).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("a_cats/3.jpg") && text.contains("truncated"),
        "{text}"
    );
    let skipping = ImageSource::new(
        index,
        ImageOptions {
            on_error: OnError::Skip,
            ..small
        },
    )
    .unwrap();
    let all = read_all(&skipping);
    assert_eq!(skipping.skipped(), 1);
    // Its place holds the next sample (b_dogs' first), with that sample's label.
    assert_eq!(label_of(&skipping, &all[2]), 1);
}

#[test]
fn empty_class_folders_are_refused_or_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let root = folder(dir.path(), &[("c_empty/readme.txt", "not_an_image.jpg")]);
    let e = ImageIndex::open(&root, false).unwrap_err().to_string();
    assert!(
        e.contains("c_empty") && e.contains("empty class folder"),
        "{e}"
    );
    let index = ImageIndex::open(&root, true).unwrap();
    assert_eq!(index.skipped().len(), 1);
    assert_eq!(index.classes().len(), 3);
    let e = ImageIndex::open(&dir.path().join("nothing"), false).unwrap_err();
    assert!(matches!(e, SourceError::Open { .. }), "{e}");
    let e = ImageIndex::open(&root.join("a_cats/2.jpg"), false).unwrap_err();
    assert!(e.to_string().contains("not a .tar shard"), "{e}");
    std::os::unix::fs::symlink(&root, root.join("b_dogs/sub/loop")).unwrap();
    let e = ImageIndex::open(&root, true).unwrap_err().to_string();
    assert!(
        e.contains("b_dogs/sub/loop") && e.contains("link loop"),
        "{e}"
    );
}

fn tar_with(path: &Path, members: &[(&str, Vec<u8>)]) {
    let mut builder = tar::Builder::new(std::fs::File::create(path).unwrap());
    for (name, data) in members {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, name, &data[..]).unwrap();
    }
    builder.finish().unwrap();
}

#[test]
fn tar_shards_group_members_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let shards = dir.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    tar_with(
        &shards.join("s-000001.tar"),
        &[
            ("k/0003.jpg", fixture("grayscale.jpg")),
            ("k/0003.json", br#"{"label": 7, "x": 1}"#.to_vec()),
        ],
    );
    tar_with(
        &shards.join("s-000000.tar"),
        &[
            ("0001.cls", b"5\n".to_vec()),
            ("0001.jpg", fixture("baseline.jpg")),
            ("0002.png", fixture("rgb.png")),
            ("0002.json", b"12".to_vec()),
        ],
    );
    let index = Arc::new(ImageIndex::open(&shards, false).unwrap());
    assert_eq!(index.labels().collect::<Vec<_>>(), vec![5, 12, 7]);
    let source = ImageSource::new(index.clone(), ImageOptions::default()).unwrap();
    let labels: Vec<i64> = read_all(&source)
        .iter()
        .map(|r| label_of(&source, r))
        .collect();
    assert_eq!(labels, vec![5, 12, 7]);
    // One shard by name, and a pattern.
    let one = ImageIndex::open(&shards.join("s-000001.tar"), false).unwrap();
    assert_eq!(one.len(), 1);
    let pattern = ImageIndex::open(&shards.join("s-*.tar"), false).unwrap();
    assert_eq!(pattern.len(), 3);
}

#[test]
fn a_tar_sample_without_its_label_is_refused_or_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("bad.tar");
    tar_with(
        &shard,
        &[
            ("a.jpg", fixture("baseline.jpg")),
            ("a.cls", b"1".to_vec()),
            ("b.jpg", fixture("baseline.jpg")),
            ("c.jpg", fixture("truncated.jpg")),
            ("c.cls", b"3".to_vec()),
        ],
    );
    let e = ImageIndex::open(&shard, false).unwrap_err().to_string();
    assert!(e.contains("bad.tar:b") && e.contains("no label"), "{e}");
    // A member whose header claims more bytes than an image may have is refused, unread
    // (its data a hole of a sparse file).
    let huge = dir.path().join("huge.tar");
    tar_with(&huge, &[("h.cls", b"1".to_vec())]);
    let cls_end = 1024; // the label's header and its padded block
    let mut header = tar::Header::new_gnu();
    header.set_path("h.jpg").unwrap();
    header.set_size(300 << 20);
    header.set_mode(0o644);
    header.set_cksum();
    let mut file = std::fs::OpenOptions::new().write(true).open(&huge).unwrap();
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(cls_end)).unwrap();
    std::io::Write::write_all(&mut file, header.as_bytes()).unwrap();
    file.set_len(cls_end + 512 + (300 << 20) + 1024).unwrap();
    let index = Arc::new(ImageIndex::open(&huge, false).unwrap());
    let source = ImageSource::new(index, ImageOptions::default()).unwrap();
    let e = source
        .read_records(0, &mut vec![0; source.layout().record_bytes()])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("huge.tar:h.jpg: 314572800 bytes, more than the 256 MiB"),
        "{e}"
    );
    let garbage = dir.path().join("garbage.tar");
    std::fs::write(&garbage, vec![0x41u8; 1000]).unwrap();
    let e = ImageIndex::open(&garbage, false).unwrap_err().to_string();
    assert!(e.contains("garbage.tar: not a readable tar archive"), "{e}");
    let index = Arc::new(ImageIndex::open(&shard, true).unwrap());
    assert_eq!((index.len(), index.skipped().len()), (2, 1));
    let source = ImageSource::new(index, ImageOptions::default()).unwrap();
    let e = source
        .read_records(1, &mut vec![0; source.layout().record_bytes()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("bad.tar:c.jpg"), "{e}");
}

/// Runs `f` on another thread and fails the test if it has not returned in ten seconds: a FIFO
/// opened for reading blocks until a writer comes, and that writer never comes.
fn within_ten_seconds<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(f()));
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .expect("blocked on a FIFO instead of refusing it")
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn a_fifo_named_like_an_image_or_a_shard_is_refused_by_type() {
    let dir = tempfile::tempdir().unwrap();
    let root = folder(dir.path(), &[]);
    mkfifo(&root.join("a_cats/3.jpg"));
    let index = Arc::new(ImageIndex::open(&root, false).unwrap());
    let small = ImageOptions {
        height: 16,
        width: 16,
        ..ImageOptions::default()
    };
    for on_error in [OnError::Raise, OnError::Skip] {
        let source = ImageSource::new(
            index.clone(),
            ImageOptions {
                on_error,
                ..small.clone()
            },
        )
        .unwrap();
        let rb = source.layout().record_bytes();
        let (result, skipped) = within_ten_seconds(move || {
            let r = source
                .read_records(2, &mut vec![0; rb])
                .map_err(|e| e.to_string());
            (r, source.skipped())
        });
        match on_error {
            OnError::Raise => {
                let e = result.unwrap_err();
                assert!(
                    e.contains("a_cats/3.jpg") && e.contains("not a regular file"),
                    "{e}"
                );
                assert!(!e.contains('\n'), "{e}");
            }
            OnError::Skip => assert_eq!((result, skipped), (Ok(()), 1)),
        }
    }
    // A tar shard in a list of shards.
    let shards = dir.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    tar_with(
        &shards.join("s-0.tar"),
        &[
            ("0001.cls", b"5\n".to_vec()),
            ("0001.jpg", fixture("baseline.jpg")),
        ],
    );
    mkfifo(&shards.join("s-1.tar"));
    for path in [shards.clone(), shards.join("s-*.tar")] {
        let e = within_ten_seconds(move || ImageIndex::open(&path, true).unwrap_err().to_string());
        assert!(
            e.contains("s-1.tar") && e.contains("not a regular file"),
            "{e}"
        );
    }
}

/// A 1-row PNG of 16-bit samples, big-endian as PNG stores them.
fn png16(color: png::ColorType, samples: &[u16]) -> Vec<u8> {
    let channels = if color == png::ColorType::Rgb { 3 } else { 1 };
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, (samples.len() / channels) as u32, 1);
    encoder.set_color(color);
    encoder.set_depth(png::BitDepth::Sixteen);
    let mut writer = encoder.write_header().unwrap();
    let data: Vec<u8> = samples.iter().flat_map(|v| v.to_be_bytes()).collect();
    writer.write_image_data(&data).unwrap();
    writer.finish().unwrap();
    out
}

/// Pillow opens a 16-bit grayscale PNG as mode "I;16" and its convert("RGB") clips each value
/// to 255; a 16-bit RGB PNG it reads by each sample's high byte. The expected rows are what
/// Pillow 13.0 gives for these images (`np.asarray(Image.open(f).convert("RGB"))[..., 0]`).
#[test]
fn sixteen_bit_pngs_convert_as_pillow_converts_them() {
    let values = [0u16, 1, 255, 256, 40000, 65535, 300, 128];
    let mut out = Vec::new();
    let gray = png16(png::ColorType::Grayscale, &values);
    decode_rgb(&gray, DEFAULT_MAX_PIXELS, &mut out).unwrap();
    let red: Vec<u8> = out.iter().step_by(3).copied().collect();
    assert_eq!(red, [0, 1, 255, 255, 255, 255, 255, 128], "grayscale");
    assert!(out.chunks(3).all(|p| p[0] == p[1] && p[1] == p[2]));
    let rgb: Vec<u16> = values.iter().flat_map(|&v| [v, v, v]).collect();
    decode_rgb(
        &png16(png::ColorType::Rgb, &rgb),
        DEFAULT_MAX_PIXELS,
        &mut out,
    )
    .unwrap();
    let red: Vec<u8> = out.iter().step_by(3).copied().collect();
    assert_eq!(red, [0, 0, 0, 1, 156, 255, 1, 0], "rgb");
}

/// Member names come from the archive: control characters in them are escaped in every
/// error, as they are in file paths, so a name cannot drive the terminal or forge a line.
#[test]
fn control_characters_in_tar_member_names_are_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("esc.tar");
    tar_with(
        &shard,
        &[
            ("a\x1b[31m\n.jpg", fixture("truncated.jpg")),
            ("a\x1b[31m\n.cls", b"1".to_vec()),
            ("b\x07.jpg", fixture("baseline.jpg")),
        ],
    );
    let e = ImageIndex::open(&shard, false).unwrap_err().to_string();
    assert!(e.contains("esc.tar:b\\u{7}") && !e.contains('\x07'), "{e}");
    let index = Arc::new(ImageIndex::open(&shard, true).unwrap());
    assert!(
        index.skipped()[0].contains("b\\u{7}") && !index.skipped()[0].contains('\x07'),
        "{:?}",
        index.skipped()
    );
    let source = ImageSource::new(index, ImageOptions::default()).unwrap();
    let e = source
        .read_records(0, &mut vec![0; source.layout().record_bytes()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("esc.tar:a\\u{1b}[31m\\n.jpg"), "{e}");
    assert!(!e.contains('\x1b') && !e.contains('\n'), "{e}");
}

/// torchvision's `Resize(2)` then `CenterCrop(8)` pads the 2x2 resized image with zeros to
/// 8x8, `(8 - 2) // 2 = 3` pixels before it each way (`CenterCrop`'s documented rule), where
/// pinfeed stretched the image over the whole output. The 2x2 in the middle is exactly
/// `Resize(2)` then `CenterCrop(2)`, in either layout.
#[test]
fn a_center_crop_larger_than_the_resized_image_is_padded_with_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let root = folder(dir.path(), &[]);
    let index = Arc::new(ImageIndex::open(&root, false).unwrap());
    // Sample 3: b_dogs/sub/a.png, 77x53.
    let one = |size: u32, layout: PixelLayout| {
        let source = ImageSource::new(
            index.clone(),
            ImageOptions {
                height: size,
                width: size,
                crop: Crop::Center { resize: 2 },
                layout,
                ..ImageOptions::default()
            },
        )
        .unwrap();
        let mut record = vec![0u8; source.layout().record_bytes()];
        source.read_records(3, &mut record).unwrap();
        record.truncate((size * size * 3) as usize);
        record
    };
    let small = one(2, PixelLayout::Nhwc);
    assert!(small.iter().any(|&v| v != 0));
    let padded = one(8, PixelLayout::Nhwc);
    for y in 0..8 {
        for x in 0..8 {
            let px = &padded[(y * 8 + x) * 3..(y * 8 + x + 1) * 3];
            if (3..5).contains(&y) && (3..5).contains(&x) {
                let at = ((y - 3) * 2 + (x - 3)) * 3;
                assert_eq!(px, &small[at..at + 3], "pixel ({y}, {x})");
            } else {
                assert_eq!(px, [0, 0, 0], "pixel ({y}, {x}) is padding");
            }
        }
    }
    let planes = one(8, PixelLayout::Nchw);
    for c in 0..3 {
        for i in 0..64 {
            assert_eq!(
                planes[c * 64 + i],
                padded[i * 3 + c],
                "channel {c}, pixel {i}"
            );
        }
    }
}
