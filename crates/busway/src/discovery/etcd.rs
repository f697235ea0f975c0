//! Discovery through etcd (`NodeConfig::etcd`). A node registers itself under
//! `PREFIX/nodes/ID` (its incarnation and listen addresses) with a lease it keeps alive, and
//! watches `PREFIX/nodes/` to know where every other node listens. A send to an id with no
//! link and no route looks the id up here and dials it (`route::outgoing::route_or_discover`).
//!
//! etcd going away stops nothing: the node keeps what it knows, says so (`Node::discovery`,
//! a warning), and registers again (a new lease) and reads the whole directory again when
//! etcd is back. A node killed without a word disappears from the others' view when its
//! lease expires; `Node::shutdown` revokes it at once.

use crate::discovery::directory::DiscoveredNode;
use crate::discovery::etcd_config::EtcdConfig;
use crate::discovery::etcd_http::{Change, Etcd, ETCD_REQUEST_TIMEOUT_MS};
use crate::link::backoff::Backoff;
use crate::shared::Shared;
use busway_core::BusId;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How long a send to an id found in etcd waits for the link it dials, in milliseconds.
pub(crate) const DISCOVERED_DIAL_WAIT_MS: u64 = 5_000;
/// Nodes a directory holds; registrations past it are ignored (and logged).
const DIRECTORY_NODES_MAX: usize = 65_536;

/// The value of a registration: `v1 INCARNATION ADDR...` (space-separated).
fn encode_registration(incarnation: u64, addrs: &[String]) -> String {
    let mut v = format!("v1 {incarnation}");
    for a in addrs {
        v.push(' ');
        v.push_str(a);
    }
    v
}

/// A registration read back; the error names what is wrong.
fn decode_registration(key: &str, prefix: &str, value: &str) -> Result<DiscoveredNode, String> {
    let id = key
        .strip_prefix(prefix)
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| format!("etcd key {key:?} does not name a bus id under {prefix:?}"))?;
    let mut words = value.split_ascii_whitespace();
    if words.next() != Some("v1") {
        return Err(format!(
            "etcd key {key:?}: value {value:?} is not a v1 registration"
        ));
    }
    let incarnation = words
        .next()
        .and_then(|w| w.parse().ok())
        .ok_or_else(|| format!("etcd key {key:?}: no incarnation in {value:?}"))?;
    Ok(DiscoveredNode {
        id: BusId(id),
        incarnation,
        addrs: words.map(str::to_owned).collect(),
    })
}

impl EtcdConfig {
    /// Where `id` is registered in etcd now, if it is (one query, no node needed): e.g. to
    /// find a relay to take as upstream. The error names what failed.
    pub async fn lookup(&self, id: BusId) -> Result<Option<DiscoveredNode>, String> {
        self.validate()?;
        let etcd = Etcd::new(&self.endpoints)?;
        let prefix = self.nodes_prefix();
        let key = format!("{prefix}{}", id.0);
        let got = etcd
            .get(&key)
            .await
            .map_err(|e| format!("etcd get {key}: {e}"))?;
        match got {
            None => Ok(None),
            Some(kv) => decode_registration(
                &String::from_utf8_lossy(&kv.key),
                &prefix,
                &String::from_utf8_lossy(&kv.value),
            )
            .map(Some),
        }
    }
}

/// Keeps this node registered in etcd and its directory current, session after session,
/// until the node stops.
pub(crate) async fn etcd_loop(shared: Arc<Shared>, config: EtcdConfig) {
    let mut backoff = Backoff::new(
        shared.config().dial_backoff_min_ms.max(100),
        shared.config().id.0 ^ shared.incarnation(),
    );
    let mut stop = shared.app.stop_signal();
    // The endpoint the last session used: the next starts there, then tries the others.
    let mut member = 0;
    loop {
        let session = etcd_session(&shared, &config, &mut backoff, &mut member);
        let ended = tokio::select! {
            r = session => r,
            _ = stop.wait_for(|&s| s) => return,
        };
        let why = ended.err().unwrap_or_else(|| "session ended".into());
        let was_up = {
            let mut st = shared.directory.lock();
            let was = st.info.connected;
            st.info.connected = false;
            st.info.last_error = Some(why.clone());
            st.session = None;
            was
        };
        if was_up {
            tracing::warn!(error = %why, known = shared.directory.lock().known.len(), "etcd unreachable: keeping the nodes known, registering again when it is back");
        } else {
            tracing::debug!(error = %why, "etcd still unreachable");
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff.next_delay()) => {}
            _ = stop.wait_for(|&s| s) => return,
        }
    }
}

/// One session: connect, register under a new lease, read the directory, then keep the
/// lease alive and follow the directory's changes until something fails.
async fn etcd_session(
    shared: &Shared,
    config: &EtcdConfig,
    backoff: &mut Backoff,
    member: &mut usize,
) -> Result<(), String> {
    let fail = |what: &str, e: String| format!("etcd {what}: {e}");
    let all = Etcd::new(&config.endpoints)?;
    // One member for the whole session (see `Etcd::member`): the first that grants a lease.
    let mut granted = Err(String::new());
    for _ in 0..all.len() {
        let etcd = all.member(*member);
        match etcd.lease_grant(config.lease_ttl_secs).await {
            Ok(lease) => {
                granted = Ok((etcd, lease));
                break;
            }
            Err(e) => {
                granted = Err(fail("lease grant", e));
                *member = (*member + 1) % all.len();
            }
        }
    }
    let (etcd, lease) = granted?;
    let prefix = config.nodes_prefix();
    let addrs = shared.advertised_addrs();
    let key = format!("{prefix}{}", shared.config().id.0);
    let value = encode_registration(shared.incarnation(), &addrs);
    etcd.put(&key, &value, lease)
        .await
        .map_err(|e| fail("put", e))?;
    let (revision, listing) = etcd
        .range_prefix(&prefix)
        .await
        .map_err(|e| fail("get", e))?;
    let mut known = HashMap::new();
    for kv in &listing {
        take_registration(shared, &prefix, &kv.key, &kv.value, &mut known);
    }
    let mut watch = etcd
        .watch(&prefix, revision + 1)
        .await
        .map_err(|e| fail("watch", e))?;
    {
        let mut st = shared.directory.lock();
        st.known = known;
        st.info.connected = true;
        st.info.registrations += 1;
        st.session = Some((etcd.clone(), lease));
    }
    backoff.reset();
    tracing::info!(%key, lease, "registered in etcd");
    let mut tick = tokio::time::interval(Duration::from_millis(config.lease_ttl_secs * 1_000 / 3));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let left = etcd.lease_keep_alive(lease).await.map_err(|e| fail("keep-alive", e))?;
                if left <= 0 {
                    return Err("etcd keep-alive: the lease expired".into());
                }
            }
            changes = watch.next() => apply_changes(shared, &prefix, changes?),
        }
    }
}

/// Takes what the directory's watch reports: nodes registered, and nodes gone.
fn apply_changes(shared: &Shared, prefix: &str, changes: Vec<Change>) {
    let mut st = shared.directory.lock();
    for change in changes {
        match change {
            Change::Put(kv) => {
                take_registration(shared, prefix, &kv.key, &kv.value, &mut st.known);
            }
            Change::Delete(key) => {
                let key = String::from_utf8_lossy(&key);
                if let Some(id) = key.strip_prefix(prefix).and_then(|s| s.parse().ok()) {
                    if st.known.remove(&BusId(id)).is_some() {
                        tracing::info!(
                            peer = id,
                            "node left etcd (deregistered or its lease expired)"
                        );
                    }
                }
            }
        }
    }
}

/// Adds (or replaces) a registration read from etcd; a false one is logged and ignored.
fn take_registration(
    shared: &Shared,
    prefix: &str,
    key: &[u8],
    value: &[u8],
    known: &mut HashMap<BusId, DiscoveredNode>,
) {
    let key = String::from_utf8_lossy(key);
    let value = String::from_utf8_lossy(value);
    match decode_registration(&key, prefix, &value) {
        Ok(n) if n.id == shared.config().id => {}
        Ok(n) => {
            if known.len() >= DIRECTORY_NODES_MAX && !known.contains_key(&n.id) {
                tracing::warn!(peer = %n.id, "etcd directory full (DIRECTORY_NODES_MAX): registration ignored");
                return;
            }
            if shared.peer(n.id).is_some_and(|p| !p.is_up()) {
                // Restarted somewhere else, perhaps: dial where it says it is now.
                shared.routes.queue_dial(n.id, n.addrs.clone());
            }
            known.insert(n.id, n);
        }
        Err(why) => tracing::warn!(%why, "false registration in etcd ignored"),
    }
}

/// Takes this node's registration out of etcd (at shutdown), within the request timeout.
pub(crate) async fn deregister(shared: &Shared) {
    let session = shared.directory.lock().session.take();
    if let Some((etcd, lease)) = session {
        let revoke = etcd.lease_revoke(lease);
        let wait = Duration::from_millis(ETCD_REQUEST_TIMEOUT_MS);
        match tokio::time::timeout(wait, revoke).await {
            Ok(Ok(_)) => tracing::info!("deregistered from etcd"),
            Ok(Err(e)) => tracing::warn!(error = %e, "could not deregister from etcd"),
            Err(_) => tracing::warn!("etcd did not answer the deregistration in time"),
        }
    }
}

/// Dials `dst` if etcd names it (and no link to it exists): true if a dial was asked for.
pub(crate) fn discover(shared: &Shared, dst: BusId) -> bool {
    if shared.config().etcd.is_none() || shared.peer(dst).is_some_and(|p| p.is_up()) {
        return false;
    }
    match shared.directory.lookup(dst) {
        Some(n) if !n.addrs.is_empty() => {
            shared.routes.queue_dial(dst, n.addrs);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_round_trip_and_false_ones_are_named() {
        let v = encode_registration(9, &["tcp://127.0.0.1:7000".into(), "unix:///a".into()]);
        let n = decode_registration("/busway/nodes/42", "/busway/nodes/", &v).unwrap();
        assert_eq!(
            n,
            DiscoveredNode {
                id: BusId(42),
                incarnation: 9,
                addrs: vec!["tcp://127.0.0.1:7000".into(), "unix:///a".into()]
            }
        );
        let err = |k: &str, v: &str| decode_registration(k, "/busway/nodes/", v).unwrap_err();
        assert!(err("/busway/nodes/x", &v).contains("does not name a bus id"));
        assert!(err("/busway/nodes/1", "v2 9").contains("not a v1 registration"));
        assert!(err("/busway/nodes/1", "v1 nine").contains("no incarnation"));
    }

    #[test]
    fn a_config_names_what_is_wrong() {
        assert!(EtcdConfig::new(vec!["http://127.0.0.1:2379".into()])
            .validate()
            .is_ok());
        assert!(EtcdConfig::new(vec![])
            .validate()
            .unwrap_err()
            .contains("at least one"));
        assert!(EtcdConfig::new(vec!["127.0.0.1:2379".into()])
            .validate()
            .unwrap_err()
            .contains("not an etcd URL"));
        let mut c = EtcdConfig::new(vec!["http://h:1".into()]);
        c.lease_ttl_secs = 1;
        assert!(c.validate().unwrap_err().contains("lease_ttl_secs: 1"));
        assert_eq!(c.nodes_prefix(), "/busway/nodes/");
    }
}
