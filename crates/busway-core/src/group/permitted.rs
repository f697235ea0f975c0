//! What a node does with a join or a publish its permissions (`permissions`) refuse: the
//! refusal reported to the host and answered to the sender with the reason (a REPAIR
//! refused), once a second per publisher and group for publishes; nothing else changes.
//! And how many groups a peer may ask for, charged to whom it stands for.

use super::host::{Host, Report};
use super::state::{GROUPS_PER_LINK_MAX, GROUPS_PER_PEER_MAX};
use crate::frame::FrameKind;
use crate::group::encode_repair_refused;
use crate::BusId;
use bytes::Bytes;

/// How many groups a peer may ask for: `GROUPS_PER_PEER_MAX` for each node it stands for
/// (itself, or each id of the range it `declared` in its HELLO; and each of the ranges it
/// `registered` since), up to `GROUPS_PER_LINK_MAX`; this node's `upstream`, which asks for
/// the rest of the bus, that much. So one downstream below a relay that asks for its whole
/// quota leaves the relay room to ask for what its other downstreams want.
pub fn interest_quota(
    upstream: bool,
    declared: Option<(BusId, BusId)>,
    registered: usize,
) -> usize {
    if upstream {
        return GROUPS_PER_LINK_MAX;
    }
    let declared = declared.map_or(1, |(lo, hi)| hi.0.saturating_sub(lo.0).saturating_add(1));
    let nodes = declared.saturating_add(registered as u64);
    let quota = nodes.saturating_mul(GROUPS_PER_PEER_MAX as u64);
    quota.min(GROUPS_PER_LINK_MAX as u64) as usize
}

/// Whether the member `from` may join `name` at the host (its permissions); if not, it is
/// reported and told why (a REPAIR refused). Interest from a node that passes groups on (a
/// relay, for its members) is its own rules' business, and always taken.
pub fn join_permitted<H: Host>(host: &mut H, from: BusId, name: &str) -> bool {
    let Some(Err(why)) = host.permissions().map(|r| r.may_join(from, name)) else {
        return true;
    };
    if host.passes_on(from) {
        return true;
    }
    let body = encode_repair_refused(false, name, &why);
    // Full or gone: the member is told at its next ask.
    let _ = host.push(from, FrameKind::Repair, &body, &Bytes::new());
    host.report(Report::JoinRefused {
        member: from,
        group: name.into(),
        why,
    });
    false
}

/// Whether `count` publishes (0: a mark) of `publisher` to `group` may be taken at the host
/// (its permissions); if not, they are reported, and the publisher is told why at most once
/// per `PUBLISH_REFUSAL_REPORT_INTERVAL_MS` per group (a mark alone tells nothing).
pub fn publish_permitted<H: Host>(
    host: &mut H,
    publisher: BusId,
    group: &str,
    count: u64,
    now_ms: u64,
) -> bool {
    let Some(Err(why)) = host.permissions().map(|r| r.may_publish(publisher, group)) else {
        return true;
    };
    let tell = count > 0 && host.groups(|_| false, |s| s.refusals.due(publisher, group, now_ms));
    if tell {
        let body = encode_repair_refused(true, group, &why);
        // Told again at a later publish.
        let _ = host.send_repair(publisher, &body, &Bytes::new());
    }
    host.report(Report::PublishesDenied {
        publisher,
        group: group.into(),
        n: count.max(1),
        why,
    });
    false
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_quota_is_charged_to_the_nodes_a_peer_stands_for() {
        use super::{interest_quota, GROUPS_PER_LINK_MAX as LINK, GROUPS_PER_PEER_MAX as PEER};
        assert_eq!(interest_quota(false, None, 0), PEER);
        assert_eq!(interest_quota(false, None, 2), 3 * PEER);
        assert_eq!(
            interest_quota(false, Some((BusId(10), BusId(12))), 0),
            3 * PEER
        );
        assert_eq!(
            interest_quota(false, Some((BusId(0), BusId(u64::MAX))), 9),
            LINK
        );
        assert_eq!(interest_quota(true, None, 0), LINK);
    }

    use super::*;
    use crate::group::permissions::tests::rule;
    use crate::group::permissions::GroupPermissions;

    /// Rules that let ids 1..=9 join and publish to `open.*` alone.
    fn host_with_rules() -> crate::group::host::fake::FakeHost {
        let mut host = crate::group::host::fake::FakeHost::new(1, &[5, 20]);
        host.permissions = Some(GroupPermissions {
            rules: vec![rule(1, 9, &["open.*"], &["open.*"])],
        });
        host
    }

    #[test]
    fn a_refused_join_is_reported_and_told_and_a_relay_s_is_taken() {
        let mut host = host_with_rules();
        assert!(join_permitted(&mut host, BusId(5), "open.a"));
        assert!(host.pushed.is_empty() && host.reports.is_empty());
        assert!(!join_permitted(&mut host, BusId(5), "closed"));
        assert!(matches!(
            &host.reports[..],
            [Report::JoinRefused {
                member: BusId(5),
                ..
            }]
        ));
        let (to, kind, _) = &host.pushed[0];
        assert_eq!((*to, *kind), (BusId(5), FrameKind::Repair), "told why");
        // A relay asks for its members: their joins are its own rules' business.
        host.relays.push(BusId(20));
        assert!(join_permitted(&mut host, BusId(20), "closed"));
    }

    #[test]
    fn refused_publishes_are_reported_each_and_told_once_a_second() {
        let mut host = host_with_rules();
        assert!(publish_permitted(&mut host, BusId(5), "open.a", 3, 0));
        assert!(!publish_permitted(&mut host, BusId(5), "closed", 3, 0));
        assert!(!publish_permitted(&mut host, BusId(5), "closed", 2, 10));
        // A mark is refused too, and counted one, and tells nothing.
        assert!(!publish_permitted(&mut host, BusId(5), "closed", 0, 2_000));
        let denied: Vec<u64> = host
            .reports
            .iter()
            .map(|r| match r {
                Report::PublishesDenied { n, .. } => *n,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(denied, [3, 2, 1]);
        assert_eq!(host.repairs_sent.len(), 1, "told once within the interval");
        assert!(!publish_permitted(&mut host, BusId(5), "closed", 1, 2_000));
        assert_eq!(host.repairs_sent.len(), 2, "told again after it");
    }
}
