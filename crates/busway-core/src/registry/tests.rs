use super::*;
use proptest::prelude::*;

fn r(lo: u64, hi: u64) -> IdRange {
    (BusId(lo), BusId(hi))
}

#[test]
fn a_registration_is_refused_with_the_reason_when_it_holds_the_relay_or_overlaps_another() {
    let me = BusId(100);
    let mut reg = Registry::default();
    assert!(reg.add(me, BusId(2), r(30, 39), None).is_ok());
    assert!(
        reg.add(me, BusId(2), r(30, 39), None).is_ok(),
        "the same range again is done"
    );
    let own = reg.add(me, BusId(3), r(90, 110), None).unwrap_err();
    assert!(own.contains("relay's own id 100"), "{own}");
    let other = reg.add(me, BusId(3), r(35, 50), None).unwrap_err();
    assert!(other.contains("registered by bus id 2"), "{other}");
    let declared = reg
        .add(me, BusId(3), r(50, 60), Some((r(55, 55), BusId(55))))
        .unwrap_err();
    assert!(declared.contains("bus id 55 declared"), "{declared}");
    let partial = reg.add(me, BusId(2), r(38, 45), None).unwrap_err();
    assert!(partial.contains("its own bus ids 30..=39"), "{partial}");
    assert_eq!(reg.lookup(BusId(35)), Some(BusId(2)));
    assert_eq!(reg.lookup(BusId(40)), None);
    assert_eq!(reg.lookup(BusId(29)), None);
    assert!(reg.remove(BusId(2), r(30, 39)));
    assert!(
        !reg.remove(BusId(2), r(30, 39)),
        "a second remove changes nothing"
    );
    assert!(reg.add(me, BusId(3), r(35, 50), None).is_ok(), "free again");
    assert!(reg.forget(BusId(3)));
    assert_eq!(reg.lookup(BusId(40)), None);
    assert!(!reg.holds_any(BusId(3)));
}

#[test]
fn one_downstream_may_hold_its_quota_and_not_one_more() {
    let mut reg = Registry::default();
    let me = BusId(u64::MAX);
    for i in 0..REGISTERED_RANGES_PER_PEER_MAX as u64 {
        reg.add(me, BusId(1), r(i * 2, i * 2), None).unwrap();
    }
    let over = reg.add(me, BusId(1), r(1, 1), None).unwrap_err();
    assert!(over.contains("the most one downstream may"), "{over}");
    assert!(
        reg.add(me, BusId(2), r(1, 1), None).is_ok(),
        "another downstream is charged nothing"
    );
    assert_eq!(reg.ranges_of(BusId(2)).collect::<Vec<_>>(), vec![r(1, 1)]);
}

#[test]
fn an_answer_names_what_was_refused_and_a_stray_answer_is_refused() {
    let mut reg = Registry::default();
    let add = RegisterOp::Add {
        version: 7,
        range: r(5, 5),
    };
    let (answer, changed) = reg.apply(BusId(5), BusId(1), &add, None);
    assert!(!changed);
    let RegisterOp::Answer {
        version: 7,
        refused: Some(why),
    } = answer
    else {
        panic!("{answer:?}")
    };
    assert!(why.contains("own id 5"), "{why}");
    let stray = RegisterOp::Answer {
        version: 1,
        refused: None,
    };
    let (answer, _) = reg.apply(BusId(5), BusId(1), &stray, None);
    assert!(matches!(
        answer,
        RegisterOp::Answer {
            refused: Some(_),
            ..
        }
    ));
}

#[test]
fn the_gate_opens_on_the_answer_and_closes_before_the_remove_goes() {
    let mut up = Upward::default();
    assert!(matches!(up.gate(BusId(31)), Gate::Refused(_)));
    let ops = up.sync([r(31, 31)], 0, 0);
    assert_eq!(ops.len(), 1);
    assert_eq!(up.gate(BusId(31)), Gate::Wait);
    let RegisterOp::Add { version, .. } = ops[0] else {
        panic!()
    };
    assert_eq!(up.answered(version, None, 0), Answered::Held(r(31, 31)));
    assert_eq!(up.gate(BusId(31)), Gate::Pass);
    assert!(up.sync([r(31, 31)], 0, 0).is_empty(), "asked once");
    // Taken back while message 10 is the next queued: the REMOVE waits for its ack.
    assert!(up.sync([], 10, 0).is_empty());
    assert!(matches!(up.gate(BusId(31)), Gate::Refused(_)));
    assert!(up.removals_due(9).is_empty());
    let due = up.removals_due(10);
    assert!(matches!(due[..], [RegisterOp::Remove { range, .. }] if range == r(31, 31)));
}

#[test]
fn a_refused_range_is_asked_again_after_its_wait_and_unanswered_ops_are_resent_in_order() {
    let mut up = Upward::default();
    let ops = up.sync([r(1, 1), r(2, 2)], 0, 0);
    assert_eq!(up.relink(), ops, "unanswered ops are sent again in order");
    let v1 = match ops[0] {
        RegisterOp::Add { version, .. } => version,
        _ => panic!(),
    };
    assert_eq!(
        up.answered(v1, Some("taken".into()), 100),
        Answered::Refused(r(1, 1), "taken".into())
    );
    let Gate::Refused(why) = up.gate(BusId(1)) else {
        panic!()
    };
    assert!(why.contains("taken"), "{why}");
    assert_eq!(up.relink().len(), 1, "the second still waits");
    assert!(up.sync([r(1, 1), r(2, 2)], 0, 200).is_empty());
    let again = up.sync([r(1, 1), r(2, 2)], 0, 100 + REGISTER_RETRY_MS);
    assert!(matches!(again[..], [RegisterOp::Add { range, .. }] if range == r(1, 1)));
    // A stale answer (its op was answered already) changes nothing.
    assert_eq!(up.answered(v1, None, 0), Answered::Nothing);
    up.reset();
    assert!(up.relink().is_empty());
    assert_eq!(up.counts(), (0, 0, 0));
}

#[test]
fn a_range_taken_back_and_wanted_again_before_its_remove_went_is_as_it_was() {
    let mut up = Upward::default();
    let ops = up.sync([r(3, 3)], 0, 0);
    let RegisterOp::Add { version, .. } = ops[0] else {
        panic!()
    };
    up.answered(version, None, 0);
    assert!(up.sync([], 5, 0).is_empty());
    assert!(matches!(up.gate(BusId(3)), Gate::Refused(_)));
    assert!(up.sync([r(3, 3)], 5, 0).is_empty(), "nothing to send");
    assert_eq!(up.gate(BusId(3)), Gate::Pass);
    assert!(up.removals_due(u64::MAX).is_empty(), "no REMOVE any more");
}

#[test]
fn a_new_link_asks_again_for_what_is_held_and_a_refusal_then_stops_it() {
    let mut up = Upward::default();
    let ops = up.sync([r(3, 3), r(4, 4)], 0, 0);
    for op in &ops {
        if let RegisterOp::Add { version, .. } = op {
            up.answered(*version, None, 0);
        }
    }
    let again = up.relink();
    assert_eq!(again.len(), 2, "every held range is asked again");
    assert_eq!(up.gate(BusId(3)), Gate::Pass, "still held meanwhile");
    let RegisterOp::Add { version, .. } = again[0] else {
        panic!()
    };
    // The upstream had forgotten it, and another took it meanwhile.
    assert!(matches!(
        up.answered(version, Some("taken".into()), 0),
        Answered::Refused(..)
    ));
    assert!(matches!(up.gate(BusId(3)), Gate::Refused(_)));
    assert_eq!(up.gate(BusId(4)), Gate::Pass);
}

#[test]
fn ops_sent_and_unanswered_are_bounded() {
    let mut up = Upward::default();
    let many: Vec<IdRange> = (0..REGISTER_UNANSWERED_MAX as u64 + 10)
        .map(|i| r(i, i))
        .collect();
    let ops = up.sync(many.iter().copied(), 0, 0);
    assert_eq!(ops.len(), REGISTER_UNANSWERED_MAX);
    assert!(up.sync(many.iter().copied(), 0, 0).is_empty(), "no room");
    let RegisterOp::Add { version, .. } = ops[0] else {
        panic!()
    };
    up.answered(version, None, 0);
    assert_eq!(up.sync(many.iter().copied(), 0, 0).len(), 1, "room for one");
    assert_eq!(
        up.relink().len(),
        REGISTER_UNANSWERED_MAX,
        "the held one has no room"
    );
}

#[test]
fn malformed_bodies_are_named() {
    let cases: [(&[u8], &str); 5] = [
        (&[], "empty"),
        (&[1, 0, 0, 0, 0, 0, 0, 0, 0], "version 0"),
        (&[9, 1, 0, 0, 0, 0, 0, 0, 0], "unknown op 9"),
        (&[1, 1, 0, 0, 0, 0, 0, 0, 0], "25 bytes"),
        (&[3, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0xff], "not UTF-8"),
    ];
    for (body, want) in cases {
        let e = RegisterOp::decode(body).unwrap_err();
        assert!(e.contains(want), "{e}");
    }
    let mut empty = RegisterOp::Add {
        version: 1,
        range: r(1, 1),
    }
    .encode();
    empty[9] = 2;
    assert!(RegisterOp::decode(&empty).unwrap_err().contains("empty"));
    let long = RegisterOp::Answer {
        version: 1,
        refused: Some("é".repeat(400)),
    };
    let RegisterOp::Answer {
        refused: Some(cut), ..
    } = RegisterOp::decode(&long.encode()).unwrap()
    else {
        panic!()
    };
    assert!(cut.len() <= REGISTER_REASON_BYTES_MAX);
}

proptest! {
    #[test]
    fn ops_round_trip(op in 1u8..=3, version in 1u64.., a: u64, b: u64, why in proptest::option::of(".{0,40}")) {
        let range = (BusId(a.min(b)), BusId(a.max(b)));
        let op = match op {
            1 => RegisterOp::Add { version, range },
            2 => RegisterOp::Remove { version, range },
            _ => RegisterOp::Answer { version, refused: why },
        };
        prop_assert_eq!(RegisterOp::decode(&op.encode()).unwrap(), op);
    }

    #[test]
    fn any_body_decodes_or_is_refused(body in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = RegisterOp::decode(&body);
    }

    #[test]
    fn lookups_agree_with_a_plain_scan(adds in proptest::collection::vec((0u64..200, 0u64..8, 0u64..4), 0..60)) {
        let mut reg = Registry::default();
        let mut plain: Vec<(IdRange, BusId)> = Vec::new();
        for (lo, len, peer) in adds {
            let range = r(lo, lo + len);
            let ok = reg.add(BusId(1_000), BusId(peer), range, None).is_ok();
            let clash = plain.iter().any(|&(x, _)| overlaps(x, range));
            let same = plain.contains(&(range, BusId(peer)));
            prop_assert_eq!(ok, !clash || same);
            if ok && !same {
                plain.push((range, BusId(peer)));
            }
        }
        for id in 0..210 {
            let want = plain.iter().find(|&&(x, _)| x.0 .0 <= id && id <= x.1 .0).map(|&(_, p)| p);
            prop_assert_eq!(reg.lookup(BusId(id)), want);
        }
    }
}
