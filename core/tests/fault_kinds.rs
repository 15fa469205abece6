//! The one table of fault kinds (`FaultKind::ALL`, `as_name`, `code`):
//! every name and code is distinct, codes are negative, names round-trip.

use std::collections::HashSet;

use ferry_core::transport::FaultKind;

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
