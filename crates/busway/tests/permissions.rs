//! Group permissions (issue #26, item 5): a node says which bus ids may join and publish to
//! which groups; what no rule allows is refused with the reason, which the sender's
//! application gets as `Event::GroupRefused`, and nothing else changes.

mod common;

use busway::{BusId, Event, GroupPermissions, GroupRule, Node};
use bytes::Bytes;
use common::*;

const HUB: u64 = 100;

fn rule(lo: u64, hi: u64, join: &[&str], publish: &[&str]) -> GroupRule {
    GroupRule {
        ids: (BusId(lo), BusId(hi)),
        join: join.iter().map(|s| s.to_string()).collect(),
        publish: publish.iter().map(|s| s.to_string()).collect(),
    }
}

async fn below(id: u64, hub: &Node) -> Node {
    let n = start(config(id).upstream(hub.listen_addrs()[0].clone())).await;
    assert!(n.wait_for_peer(BusId(HUB), WAIT).await, "{id} is up");
    n
}

/// The first `GroupRefused` event of `events`.
async fn refused(events: &mut busway::Events) -> (String, BusId, bool, String) {
    wait_event(events, |e| match e {
        Event::GroupRefused {
            group,
            by,
            publish,
            reason,
        } => Some((group.clone(), *by, *publish, reason.clone())),
        _ => None,
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_and_publishes_are_taken_as_the_rules_allow_and_refused_with_the_reason() {
    let mut c = config(HUB).listen(listen_addr("tcp4"));
    c.group_permissions = Some(GroupPermissions {
        rules: vec![
            rule(1, 9, &["scores", "chat.*"], &[]),
            rule(20, 20, &[], &["scores"]),
        ],
    });
    let hub = start(c).await;
    let member = below(1, &hub).await;
    let mut member_events = member.take_events().unwrap();
    let mut inbox = member.take_inbox().unwrap();
    member.join("scores").unwrap();
    member.join("chat.lobby").unwrap();
    // A join no rule for its id allows: refused, with the reason.
    let stranger = below(2, &hub).await;
    let mut stranger_events = stranger.take_events().unwrap();
    stranger.join("news").unwrap();
    let (group, by, publish, reason) = refused(&mut stranger_events).await;
    assert_eq!((group.as_str(), by, publish), ("news", BusId(HUB), false));
    assert!(reason.contains("may not join group \"news\""), "{reason}");
    // The allowed publisher reaches the member; one no rule names is refused.
    let allowed = below(20, &hub).await;
    let denied = below(30, &hub).await;
    let mut denied_events = denied.take_events().unwrap();
    until("the member's interest reached both publishers", || {
        !allowed.group_links("scores").is_empty() && !denied.group_links("scores").is_empty()
    })
    .await;
    for i in 0..100u64 {
        denied
            .publish("scores", Bytes::from(i.to_le_bytes().to_vec()))
            .await
            .unwrap();
    }
    let (group, by, publish, reason) = refused(&mut denied_events).await;
    assert_eq!((group.as_str(), by, publish), ("scores", BusId(HUB), true));
    assert!(reason.contains("no rule names its id"), "{reason}");
    for i in 0..100u64 {
        allowed
            .publish("scores", Bytes::from(i.to_le_bytes().to_vec()))
            .await
            .unwrap();
    }
    let mut got = 0u64;
    tokio::time::timeout(WAIT, async {
        while got < 100 {
            let b = inbox.recv_batch().await.unwrap();
            assert_eq!(b.src(), BusId(20), "only the allowed publisher's");
            for m in b.iter() {
                assert_eq!(m, &got.to_le_bytes());
                got += 1;
            }
        }
    })
    .await
    .expect("the allowed publishes arrive");
    // The denied publishes came by another link than the allowed ones: counted as they
    // are read there, waited for rather than assumed done.
    until("the hub counted the 100 denied publishes", || {
        hub.stats().publishes_denied >= 100
    })
    .await;
    assert_eq!(hub.stats().group_joins_refused, 1);
    while let Some(e) = member_events.try_recv() {
        assert!(!matches!(e, Event::GroupRefused { .. }), "{e:?}");
    }
}

#[test]
fn permissions_come_from_a_config_file_and_a_bad_rule_is_named() {
    let c = busway::NodeConfig::from_toml(
        "id = 1\n\n[[group_permissions]]\nids = [1, 9]\njoin = [\"scores\", \"chat.*\"]\n\n[[group_permissions]]\nids = [20, 20]\npublish = [\"*\"]\n",
    )
    .unwrap();
    let p = c.group_permissions.expect("rules");
    assert_eq!(p.rules.len(), 2);
    assert!(p.may_join(BusId(3), "chat.lobby").is_ok());
    assert!(p.may_publish(BusId(20), "anything").is_ok());
    assert!(p.may_publish(BusId(3), "scores").is_err());
    let bad = busway::NodeConfig::from_toml(
        "id = 1\n\n[[group_permissions]]\nids = [1, 9]\njoin = [\"chat*\"]\n",
    )
    .unwrap_err();
    assert_eq!(bad.setting(), Some("[[group_permissions]]"));
    assert_eq!(bad.line(), Some(3));
    assert_eq!(bad.kind(), busway::ErrorKind::Config);
    let bad = bad.to_string();
    assert!(bad.contains("[[group_permissions]] (from line 3)"), "{bad}");
    assert!(bad.contains("`*` stands alone"), "{bad}");
}
