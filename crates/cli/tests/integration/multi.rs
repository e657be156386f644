//! `pinfeed stream --devices`: several devices from one process, split or replicated, on the
//! host backend (each `cpu` a backend of its own).

use crate::common::{fixture, json_report, one_line_error, pinfeed, shown};

fn multi_stream(path: &str, devices: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "stream",
        path,
        "--batch-size",
        "64",
        "--devices",
        devices,
        "--json",
        "--verify",
    ];
    args.extend_from_slice(extra);
    json_report(&pinfeed(args))
}

/// The report of one `cpu` device streaming `path` with `--crc`: what every multi-device CRC is
/// compared with.
fn single_device(path: &str) -> serde_json::Value {
    json_report(&pinfeed([
        "stream",
        path,
        "--batch-size",
        "64",
        "--device",
        "cpu",
        "--crc",
        "--json",
    ]))
}

#[test]
fn replicated_devices_each_get_every_byte_read_once() {
    let (_dir, path) = fixture("gen.npy");
    let gen = pinfeed(["gen", &shown(&path), "--records", "1001", "--shape", "3,5"]);
    assert_eq!(gen.code, Some(0), "{}", gen.stderr);
    let one = single_device(&shown(&path));
    let bytes = 1001 * 15; // u8 records of 3 x 5
    for pieces in ["4MiB", "1KiB"] {
        let r = multi_stream(
            &shown(&path),
            "cpu,cpu,cpu",
            &["--replicate", "--piece-size", pieces, "--epochs", "2"],
        );
        assert_eq!(r["mode"], "replicate");
        assert_eq!(r["verified"], true);
        assert_eq!(r["read_bytes"], 2 * bytes, "read once");
        assert_eq!(r["bytes"], 3 * 2 * bytes);
        let devices = r["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 3);
        for d in devices {
            assert_eq!(d["device"], "cpu");
            assert_eq!(d["bytes"], 2 * bytes);
            assert_eq!(d["records"], 2002);
            assert!(d["gbps"].as_f64().unwrap() > 0.0);
        }
        assert!(r["gbps"].as_f64().unwrap() > 0.0);
        assert!(r["pinned_bytes_peak"].as_u64().unwrap() <= 256 << 20);
    }
    // Each device's CRC is that of the whole file, as one device sees it.
    let r = multi_stream(&shown(&path), "cpu,cpu", &["--replicate"]);
    for d in r["devices"].as_array().unwrap() {
        assert_eq!(d["crc32"], one["crc32"]);
    }
}

#[test]
fn split_devices_share_each_epoch() {
    let (_dir, path) = fixture("gen.npy");
    assert_eq!(
        pinfeed(["gen", &shown(&path), "--records", "1001", "--shape", "4"]).code,
        Some(0)
    );
    let r = multi_stream(&shown(&path), "cpu,cpu,cpu", &["--shuffle", "random"]);
    assert_eq!(r["mode"], "split");
    assert_eq!(r["verified"], true);
    // 1001 records padded to 1002, a third each.
    assert_eq!(r["records"], 1002);
    assert_eq!(r["bytes"], r["read_bytes"]);
    for d in r["devices"].as_array().unwrap() {
        assert_eq!(d["records"], 334);
    }
}

#[test]
fn bad_device_lists_are_one_line_errors() {
    let (_dir, path) = fixture("gen.npy");
    assert_eq!(
        pinfeed(["gen", &shown(&path), "--records", "10"]).code,
        Some(0)
    );
    let p = shown(&path);
    let base = ["stream", p.as_str(), "--batch-size", "4"];
    let run = |extra: &[&str]| pinfeed(base.iter().chain(extra).copied().collect::<Vec<_>>());
    one_line_error(&run(&["--devices", "cpu,tpu:1"]), &["tpu:1"]);
    one_line_error(&run(&["--replicate"]), &["--devices"]);
    one_line_error(
        &run(&["--device", "cpu", "--devices", "cpu,cpu"]),
        &["--devices"],
    );
    one_line_error(
        &run(&[
            "--devices",
            "cpu,cpu",
            "--replicate",
            "--reader",
            "register",
        ]),
        &["register reader"],
    );
}

/// With --verify, a split run's top-level CRC covers every delivered byte, step by step, each
/// step's batches in device order: the single device's CRC when the split needs no padding.
#[test]
fn split_crc_is_the_single_device_crc() {
    let (_dir, path) = fixture("gen.npy");
    assert_eq!(
        pinfeed(["gen", &shown(&path), "--records", "1000", "--shape", "3"]).code,
        Some(0)
    );
    let one = single_device(&shown(&path));
    assert!(one["crc32"].is_u64(), "{one}");
    for devices in ["cpu,cpu", "cpu,cpu,cpu,cpu"] {
        let r = multi_stream(&shown(&path), devices, &["--epochs", "2"]);
        assert_eq!(r["verified"], true);
        let d = r["devices"].as_array().unwrap();
        assert!(d.iter().all(|d| d["crc32"].is_u64()), "{r}");
        let again = multi_stream(&shown(&path), devices, &[]);
        assert_eq!(again["crc32"], one["crc32"], "{devices}");
        assert_ne!(r["crc32"], again["crc32"], "two epochs, two passes");
    }
}
