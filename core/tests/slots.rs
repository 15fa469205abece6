//! Tensor layout, dtypes, preallocated slots and capacity counters.

use tensorferry_core::json::JsonStr;
use tensorferry_core::slots::*;
use tensorferry_core::wire::{
    decode, Manifest, Msg, PreallocatedSlot, Shape, SlotList, TensorEntry,
};

#[test]
fn every_dtype_sglang_names_with_its_size() {
    let sizes = [
        ("float16", 2),
        ("float32", 4),
        ("float64", 8),
        ("bfloat16", 2),
        ("int8", 1),
        ("int16", 2),
        ("int32", 4),
        ("int64", 8),
        ("uint8", 1),
        ("bool", 1),
        ("float8_e4m3fn", 1),
        ("float8_e5m2", 1),
        ("uint16", 2),
        ("uint32", 4),
        ("uint64", 8),
        ("complex64", 8),
        ("complex128", 16),
    ];
    for (name, size) in sizes {
        let d = Dtype::from_name(name).unwrap();
        assert_eq!((d.name(), d.size()), (name, size));
        assert_eq!(Dtype::from_name(&format!("torch.{name}")), Ok(d));
    }
    assert_eq!(Dtype::ALL.len(), sizes.len());
    for bad in [
        "",
        "float",
        "bfloat",
        "torch.",
        "Float16",
        "float16 ",
        "int4",
        "torch.torch.int8",
    ] {
        if bad == "float" {
            continue; // PyTorch's alias for float32
        }
        assert_eq!(Dtype::from_name(bad), Err(UnknownDtype), "{bad:?}");
    }
}

fn spec<'a>(
    field: &'a str,
    list_index: Option<u64>,
    shape: &'a [u64],
    dtype: Dtype,
) -> TensorSpec<'a> {
    let byte_len = shape.iter().product::<u64>() * dtype.size();
    TensorSpec {
        field,
        list_index,
        shape,
        dtype,
        byte_len,
    }
}

#[test]
fn layout_aligns_every_tensor_and_counts_the_padding() {
    let specs = [
        spec("prompt_embeds", None, &[1, 512, 4096], Dtype::BFloat16),
        spec("timesteps", None, &[3], Dtype::Float32),
        spec("latents", Some(0), &[1, 16, 21, 90, 160], Dtype::BFloat16),
        spec("latents", Some(1), &[7], Dtype::UInt8),
        spec("empty", None, &[0, 4], Dtype::Float64),
    ];
    let mut out = [TensorEntry {
        field: JsonStr::EMPTY,
        list_index: None,
        offset: 0,
        shape: Shape::Dims(&[]),
        dtype: JsonStr::EMPTY,
    }; 8];
    let l = layout(&specs, &mut out).unwrap();
    assert_eq!(l.tensors, 5);
    let offsets: Vec<u64> = out[..5].iter().map(|e| e.offset).collect();
    let p = 4_194_304; // prompt_embeds
    let lat = 2 * 16 * 21 * 90 * 160;
    assert_eq!(
        offsets,
        vec![0, p, p + 512, p + 512 + lat, p + 512 + lat + 512]
    );
    assert!(offsets.iter().all(|o| o % TENSOR_ALIGN == 0));
    assert_eq!(l.data_size, p + 512 + lat + 512); // the empty tensor ends where it starts
    assert_eq!(l.data_size % TENSOR_ALIGN, 0);
    // The manifest it makes passes the receiver's check in a slot of that
    // size, and not in a smaller one.
    let m = Manifest::Entries(&out[..l.tensors]);
    let extent = check_manifest(&m, l.data_size).unwrap();
    assert_eq!(extent.tensors, 5);
    assert!(extent.end <= l.data_size);
    assert!(matches!(
        check_manifest(&m, extent.end - 1),
        Err(LayoutError::OutOfSlot { index: 4, .. })
    ));
    // Wire round trip: the encoded manifest decodes to the same entries.
    let msg = Msg::Ready(tensorferry_core::wire::Ready {
        request_id: "r".into(),
        manifest: m,
        ..Default::default()
    });
    let mut buf = vec![0u8; msg.encoded_len(Default::default())];
    let n = msg.encode(&mut buf).unwrap();
    let Msg::Ready(back) = decode(&buf[..n]).unwrap() else {
        panic!()
    };
    assert_eq!(back.manifest, m);
    assert_eq!(check_manifest(&back.manifest, l.data_size), Ok(extent));
}

#[test]
fn layout_rejects_bad_input_and_writes_nothing() {
    let blank = TensorEntry {
        field: JsonStr::EMPTY,
        list_index: None,
        offset: 99,
        shape: Shape::Dims(&[]),
        dtype: JsonStr::EMPTY,
    };
    let mut out = [blank; 2];
    let ok = spec("a", None, &[4], Dtype::Int32);
    assert_eq!(
        layout(&[ok, ok, ok], &mut out),
        Err(LayoutError::OutputTooSmall { needed: 3 })
    );
    let wrong = TensorSpec { byte_len: 15, ..ok };
    assert_eq!(
        layout(&[ok, wrong], &mut out),
        Err(LayoutError::ByteLenMismatch {
            index: 1,
            expected: 16,
            byte_len: 15
        })
    );
    let huge = TensorSpec {
        shape: &[u64::MAX, 2],
        ..ok
    };
    assert_eq!(
        layout(&[huge], &mut out),
        Err(LayoutError::Overflow { index: 0 })
    );
    let big = TensorSpec {
        shape: &[u64::MAX / 4],
        byte_len: u64::MAX / 4 * 4,
        ..ok
    };
    assert_eq!(
        layout(&[big, big], &mut out),
        Err(LayoutError::Overflow { index: 1 })
    );
    assert_eq!(out[0].offset, 99, "nothing written on error");
    assert_eq!(
        layout(&[], &mut out),
        Ok(Layout {
            tensors: 0,
            data_size: 0
        })
    );
}

fn ready_manifest(manifest: &str) -> Manifest<'_> {
    let payload: &'static str = Box::leak(
        format!("{{\"msg_type\":\"transfer_ready\",\"manifest\":{manifest}}}").into_boxed_str(),
    );
    let Msg::Ready(r) = decode(payload.as_bytes()).unwrap() else {
        panic!()
    };
    r.manifest
}

#[test]
fn check_manifest_names_the_bad_entry() {
    type IsExpected = fn(&LayoutError) -> bool;
    let cases: [(&str, IsExpected); 5] = [
        (r#"{"a":[{"offset":0,"shape":[2],"dtype":"int4"}]}"#, |e| {
            matches!(e, LayoutError::UnknownDtype { index: 0 })
        }),
        (
            r#"{"a":[{"offset":0,"shape":[2],"dtype":"int8"},{"offset":100,"shape":[2],"dtype":"int8"}]}"#,
            |e| {
                matches!(
                    e,
                    LayoutError::Misaligned {
                        index: 1,
                        offset: 100
                    }
                )
            },
        ),
        (
            r#"{"a":[{"offset":512,"shape":[1024],"dtype":"int8"}]}"#,
            |e| {
                matches!(
                    e,
                    LayoutError::OutOfSlot {
                        index: 0,
                        end: 1536,
                        slot_size: 1024
                    }
                )
            },
        ),
        (
            r#"{"a":[{"offset":0,"shape":[4294967296,4294967296],"dtype":"int16"}]}"#,
            |e| matches!(e, LayoutError::Overflow { index: 0 }),
        ),
        (r#"{"a":[{"offset":0,"shape":[1]}]}"#, |e| {
            matches!(e, LayoutError::Entry { index: 0, .. })
        }),
    ];
    for (m, is) in cases {
        let e = check_manifest(&ready_manifest(m), 1024).unwrap_err();
        assert!(is(&e), "{m}: {e:?}");
        assert!(!e.to_string().is_empty());
    }
    // Escaped and torch.-prefixed dtypes are fine.
    let m = ready_manifest(r#"{"a":{"offset":0,"shape":[2],"dtype":"torch.b\u0066loat16"}}"#);
    assert_eq!(check_manifest(&m, 4).unwrap().end, 4);
}

fn slot(slot_id: u64, offset: u64, size: u64) -> PreallocatedSlot {
    PreallocatedSlot {
        offset,
        size,
        slot_id,
        addr: offset.wrapping_add(0x1000),
    }
}

#[test]
fn preallocated_slots_first_fit_and_come_back_whole() {
    let slots = [
        slot(7, 0, 1 << 20),
        slot(8, 1 << 20, 4 << 20),
        slot(9, 5 << 20, 2 << 20),
    ];
    let mut t =
        PreallocTable::<4>::from_registration(&SlotList::Slots(&slots), 0x1000, 8 << 20).unwrap();
    assert_eq!((t.len(), t.free(), t.free_fitting(2 << 20)), (3, 3, 2));
    // First in table order that fits, not best fit.
    assert_eq!(t.take(1 << 20).map(|s| s.slot_id), Some(7));
    assert_eq!(t.take(1).map(|s| s.slot_id), Some(8));
    assert_eq!(t.take(3 << 20), None);
    assert_eq!(t.take(2 << 20).map(|s| s.slot_id), Some(9));
    assert_eq!(t.free(), 0);
    // A small transfer used slot 8; it comes back at its original size.
    assert_eq!(t.give_back(8).unwrap().size, 4 << 20);
    assert_eq!(t.take(4 << 20).map(|s| s.slot_id), Some(8));
    assert_eq!(t.give_back(8), Ok(slots[1]));
    assert_eq!(t.give_back(8), Err(PreallocError::NotTaken { slot_id: 8 }));
    assert_eq!(
        t.give_back(99),
        Err(PreallocError::UnknownSlot { slot_id: 99 })
    );
    assert_eq!(t.get(9), Some((slots[2], true)));
    // Never lost: every slot is still there.
    assert_eq!(t.iter().collect::<Vec<_>>(), slots.to_vec());
}

#[test]
fn registrations_with_bad_slots_are_refused_whole() {
    let reg = |slots: &[PreallocatedSlot]| {
        PreallocTable::<2>::from_registration(&SlotList::Slots(slots), 0x1000, 8 << 20)
    };
    assert_eq!(
        reg(&[slot(1, 0, 1), slot(1, 512, 1)]).unwrap_err(),
        PreallocError::DuplicateId { slot_id: 1 }
    );
    assert_eq!(
        reg(&[slot(1, 0, 1024), slot(2, 512, 1024)]).unwrap_err(),
        PreallocError::Overlap {
            slot_id: 2,
            other: 1
        }
    );
    assert_eq!(
        reg(&[slot(1, 0, 0)]).unwrap_err(),
        PreallocError::OutsidePool { slot_id: 1 }
    );
    assert_eq!(
        reg(&[slot(1, 8 << 20, 1)]).unwrap_err(),
        PreallocError::OutsidePool { slot_id: 1 }
    );
    assert_eq!(
        reg(&[slot(1, u64::MAX, 2)]).unwrap_err(),
        PreallocError::OutsidePool { slot_id: 1 }
    );
    let bad_addr = PreallocatedSlot {
        addr: 5,
        ..slot(1, 0, 1)
    };
    assert_eq!(
        reg(&[bad_addr]).unwrap_err(),
        PreallocError::OutsidePool { slot_id: 1 }
    );
    assert_eq!(
        reg(&[slot(1, 0, 1), slot(2, 512, 1), slot(3, 1024, 1)]).unwrap_err(),
        PreallocError::TableFull { capacity: 2 }
    );
    // From the wire, malformed entries are typed errors too.
    let Msg::Register(r) = decode(br#"{"msg_type":"transfer_register","preallocated_slots":[{"offset":0,"size":1,"slot_id":0}]}"#).unwrap() else { panic!() };
    assert!(matches!(
        PreallocTable::<2>::from_registration(&r.preallocated_slots, 0, 1 << 20),
        Err(PreallocError::Malformed(_))
    ));
}

#[test]
fn capacity_is_released_exactly_once() {
    let mut c = Capacity::new(1, 2);
    let a = c.acquire().unwrap();
    let b = c.acquire().unwrap();
    assert_eq!(c.acquire(), Err(CapacityError::Full { limit: 2 }));
    assert_eq!((c.in_use(), c.available(), c.refused()), (2, 0, 1));
    c.release(a).unwrap();
    assert_eq!(c.available(), 1);
    let mut other = Capacity::new(2, 5);
    assert_eq!(
        other.release(b),
        Err(CapacityError::WrongCounter {
            ticket: 1,
            counter: 2
        })
    );
    assert_eq!((other.in_use(), c.in_use()), (0, 1));
    c.set_limit(0);
    assert_eq!((c.available(), c.acquired(), c.released()), (0, 2, 1));
}
