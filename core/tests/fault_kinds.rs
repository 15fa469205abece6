//! The one table of fault kinds (`FaultKind::ALL`, `as_name`, `code`):
//! every name and code is distinct, codes are negative, names round-trip.

use std::collections::HashSet;

use tensorferry_core::transport::FaultKind;

#[test]
fn names_and_codes_are_distinct_and_round_trip() {
    let names: HashSet<_> = FaultKind::ALL.iter().map(|k| k.as_name()).collect();
    let codes: HashSet<_> = FaultKind::ALL.iter().map(|k| k.code()).collect();
    assert_eq!(names.len(), FaultKind::ALL.len());
    assert_eq!(codes.len(), FaultKind::ALL.len());
    for kind in FaultKind::ALL {
        assert!(kind.code() < 0, "{kind:?}");
        assert_eq!(FaultKind::from_name(kind.as_name()), Some(kind));
        assert!(kind
            .as_name()
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b == b'_'));
    }
    assert_eq!(FaultKind::from_name("no such kind"), None);
    // The catch-all is last, and sglang's contract's -1.
    assert_eq!(FaultKind::ALL[FaultKind::ALL.len() - 1], FaultKind::Io);
    assert_eq!(FaultKind::Io.code(), -1);
}

#[test]
fn every_errno_kind_is_in_the_table() {
    for errno in 0..200 {
        assert!(FaultKind::ALL.contains(&FaultKind::of_errno(errno)));
    }
}

#[test]
fn a_sources_bounds_are_checked_against_its_region_in_one_place() {
    use tensorferry_core::transport::{Region, RegionError};
    let r = Region {
        id: 3,
        addr: 0x1000,
        len: 4096,
    };
    assert_eq!(r.check_source(0, 4096), Ok(()));
    assert_eq!(r.check_source(4095, 1), Ok(()));
    let past = r.check_source(4095, 2).unwrap_err();
    assert_eq!(
        past,
        RegionError::SourceOutOfBounds {
            region: 3,
            offset: 4095,
            len: 2,
            region_len: 4096
        }
    );
    // An end past u64::MAX is out of bounds, not a wrap.
    assert!(r.check_source(u64::MAX, 2).is_err());
    assert_eq!(
        past.kind(),
        tensorferry_core::transport::FaultKind::OutOfBounds
    );
    assert_eq!(
        RegionError::Unknown(9).kind(),
        tensorferry_core::transport::FaultKind::OutOfBounds
    );
    assert_eq!(
        RegionError::TooMany { max: 16 }.kind(),
        tensorferry_core::transport::FaultKind::Registration
    );
    assert!(past.to_string().contains("outside region 3"));
}
