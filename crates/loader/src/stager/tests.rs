//! Uploads through the arena and the lanes, on the host backend (and a GPU where marked).

use super::*;

fn host_stager(budget: usize, piece: usize) -> Stager {
    Stager::new(StagerOptions {
        device: DeviceSpec::Cpu,
        pinned_budget: budget,
        num_threads: Some(3),
        piece_bytes: Some(piece),
        ..StagerOptions::default()
    })
    .unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn uploads_of_every_size_arrive_intact() {
    let stager = host_stager(64 << 10, 16 << 10);
    for (i, len) in [0, 1, 4095, 4096, 4097, 16 << 10, 100_000, 1 << 20, 3 << 20]
        .into_iter()
        .enumerate()
    {
        let src = pattern(len, i as u8);
        let array = stager.upload(&src).unwrap();
        assert_eq!(array.len_bytes(), len);
        assert_eq!(
            array.host_bytes().unwrap().unwrap(),
            &src[..],
            "length {len}"
        );
    }
    assert_eq!(stager.pinned_bytes(), 64 << 10);
}

#[test]
fn held_arrays_stay_intact_while_the_arena_wraps() {
    let stager = host_stager(32 << 10, 8 << 10);
    let sources: Vec<Vec<u8>> = (0..50).map(|i| pattern(5000 + i * 97, i as u8)).collect();
    let arrays: Vec<DeviceArray> = sources.iter().map(|s| stager.upload(s).unwrap()).collect();
    for (src, array) in sources.iter().zip(&arrays) {
        let mut back = vec![0; src.len()];
        array.read_back(&mut back).unwrap();
        assert_eq!(&back, src);
    }
}

#[test]
fn arena_fit_respects_in_flight_pieces() {
    let done = || CopyFence::Host(Arc::default());
    let mut arena = Arena::default();
    assert_eq!(arena.fit(100, 100), Some(0));
    arena.pieces.push_back((0, 60, done()));
    assert_eq!(arena.fit(100, 40), Some(60));
    assert_eq!(arena.fit(100, 41), None);
    arena.pieces.push_back((60, 90, done()));
    arena.pieces.pop_front();
    // Free: [90, 100) and [0, 60).
    assert_eq!(arena.fit(100, 10), Some(90));
    assert_eq!(arena.fit(100, 60), Some(0));
    assert_eq!(arena.fit(100, 61), None);
    arena.pieces.push_back((0, 50, done()));
    // Wrapped: free is [50, 60).
    assert_eq!(arena.fit(100, 10), Some(50));
    assert_eq!(arena.fit(100, 11), None);
}

#[test]
fn to_device_moves_a_large_buffer() {
    let src = pattern(5 << 20, 7);
    let array = to_device(
        &src,
        StagerOptions {
            device: DeviceSpec::Cpu,
            pinned_budget: 1 << 20,
            ..StagerOptions::default()
        },
    )
    .unwrap();
    assert_eq!(
        crc32fast::hash(array.host_bytes().unwrap().unwrap()),
        crc32fast::hash(&src)
    );
}

fn lanes_stager(method: UploadMethod) -> Stager {
    Stager::new(StagerOptions {
        device: DeviceSpec::Cpu,
        pinned_budget: 16 << 20,
        num_threads: Some(3),
        method,
        ..StagerOptions::default()
    })
    .unwrap()
}

#[test]
fn every_method_delivers_every_byte_from_any_alignment() {
    // Sources starting and ending at every kind of offset from a page boundary, smaller
    // and larger than the register lane's chunks (4 MiB with this budget).
    let backing = pattern((41 << 20) + 3 * 4096, 11);
    for method in [
        UploadMethod::Both,
        UploadMethod::Stage,
        UploadMethod::Register,
    ] {
        let stager = lanes_stager(method);
        for (start, len) in [
            (0, 41 << 20),
            (1, (41 << 20) - 1),
            (4095, 9 << 20),
            (4096, 8 << 20),
            (123, (4 << 20) + 77),
            (7, 4096),
            (0, 1),
        ] {
            let src = &backing[start..start + len];
            let array = stager.upload(src).unwrap();
            assert_eq!(
                crc32fast::hash(array.host_bytes().unwrap().unwrap()),
                crc32fast::hash(src),
                "{method} from offset {start}, {len} bytes"
            );
        }
    }
}

#[test]
fn large_uploads_use_both_lanes_and_small_ones_the_arena() {
    let src = pattern(40 << 20, 3);
    let stager = lanes_stager(UploadMethod::Both);
    assert_eq!(
        stager.pinned_bytes(),
        8 << 20,
        "half the budget is the arena"
    );
    assert_eq!(stager.pinned_budget(), 16 << 20);
    // Less than two whole chunks (4 MiB each here) between the partial pages: arena only.
    stager.upload(&src[..6 << 20]).unwrap();
    let small = stager.counters();
    assert_eq!(small.staged_bytes, 6 << 20, "{small:?}");
    assert_eq!(small.registered_bytes, 0, "{small:?}");
    stager.upload(&src).unwrap();
    let c = stager.counters();
    assert_eq!(
        c.staged_bytes + c.registered_bytes,
        (46 << 20) as u64,
        "{c:?}"
    );
    assert!(
        c.registered_bytes > 0 && c.staged_bytes > (6 << 20),
        "{c:?}"
    );
    assert_eq!(c.direct_bytes, 0);
    assert_eq!(c.register_error, None);

    let register = lanes_stager(UploadMethod::Register);
    let base = src.as_ptr() as usize;
    let skip = base.next_multiple_of(4096) - base + 100;
    register.upload(&src[skip..]).unwrap();
    let c = register.counters();
    // Only the partial pages at either end go through the arena.
    assert!(c.staged_bytes < 2 * 4096, "{c:?}");
    assert_eq!(
        c.staged_bytes + c.registered_bytes,
        (src.len() - skip) as u64
    );

    let stage = lanes_stager(UploadMethod::Stage);
    assert_eq!(
        stage.pinned_bytes(),
        16 << 20,
        "no lane: the arena has it all"
    );
    stage.upload(&src).unwrap();
    assert_eq!(stage.counters().registered_bytes, 0);
}

#[test]
fn small_budgets_leave_the_register_lane_out() {
    let stager = Stager::new(StagerOptions {
        device: DeviceSpec::Cpu,
        pinned_budget: 8 << 20,
        method: UploadMethod::Register,
        ..StagerOptions::default()
    })
    .unwrap();
    assert_eq!(stager.pinned_bytes(), 8 << 20);
    let src = pattern(20 << 20, 5);
    let array = stager.upload(&src).unwrap();
    assert_eq!(array.host_bytes().unwrap().unwrap(), &src[..]);
    assert_eq!(stager.counters().registered_bytes, 0);
}

#[test]
fn upload_methods_parse_and_print() {
    for m in [
        UploadMethod::Both,
        UploadMethod::Stage,
        UploadMethod::Register,
    ] {
        assert_eq!(m.to_string().parse::<UploadMethod>().unwrap(), m);
    }
    let err = "fast".parse::<UploadMethod>().unwrap_err();
    assert!(
        err.to_string().contains("expected both, stage or register"),
        "{err}"
    );
}

#[test]
fn tiny_budgets_are_refused() {
    let err = Stager::new(StagerOptions {
        device: DeviceSpec::Cpu,
        pinned_budget: 100,
        ..StagerOptions::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("too small"), "{err}");
}
