//! Who may join and publish to which groups at a node (the runtime's
//! `NodeConfig::group_permissions`),
//! as NATS permissions do for subjects: rules by bus id range, each with the group names (or
//! `prefix.*` patterns, or `*`) its ids may join and may publish to. No rules: open, as
//! before. With rules, a join or publish no rule allows is refused, counted, and answered
//! with the reason (a REPAIR refused, which the sender's application gets as
//! the runtime's `Event::GroupRefused`); nothing else changes. With TLS the ids are those the peers'
//! certificates name (a link may not speak for others, see `relay::Sources`).

use crate::group::check_name;
use crate::BusId;
use std::collections::HashMap;

/// Rules a node may hold at most.
pub const GROUP_RULES_MAX: usize = 256;
/// Patterns one rule may list at most, for joins and for publishes each.
pub const GROUP_RULE_PATTERNS_MAX: usize = 64;
/// How often a publisher is told, at most, that one group's publishes are refused here, in
/// milliseconds (a refused stream is not answered publish by publish).
pub const PUBLISH_REFUSAL_REPORT_INTERVAL_MS: u64 = 1_000;
/// (publisher, group) pairs whose last refusal report a node remembers; past it, the table is
/// emptied (a publisher then hears once more than it would have).
const REFUSAL_REPORTS_MAX: usize = 1_024;

/// One rule: the ids `ids` (both ends included) may join the groups `join` names and publish
/// to those `publish` names. A pattern is a group's name, `prefix.*` (every name that starts
/// with `prefix.`), or `*` (every group).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupRule {
    /// The bus ids the rule is for, `lo <= hi`.
    pub ids: (BusId, BusId),
    /// The groups they may join.
    pub join: Vec<String>,
    /// The groups they may publish to.
    pub publish: Vec<String>,
}

/// A node's group permissions: what its rules allow, nothing else.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupPermissions {
    /// The rules; an id may match several (what any of them allows is allowed).
    pub rules: Vec<GroupRule>,
}

fn matches(pattern: &str, group: &str) -> bool {
    if pattern == "*" || pattern == group {
        return true;
    }
    pattern
        .strip_suffix('*')
        .is_some_and(|prefix| prefix.ends_with('.') && group.starts_with(prefix))
}

fn check_pattern(pattern: &str) -> Result<(), String> {
    if pattern == "*" {
        return Ok(());
    }
    let name = match pattern.strip_suffix(".*") {
        Some(prefix) => prefix,
        None if pattern.contains('*') => {
            return Err(format!(
                "pattern {pattern:?}: `*` stands alone or ends a `prefix.*`"
            ))
        }
        None => pattern,
    };
    check_name(name).map_err(|e| format!("pattern {pattern:?}: {e}"))
}

impl GroupPermissions {
    /// Whether `id` may join `group` here; the error says why not.
    pub fn may_join(&self, id: BusId, group: &str) -> Result<(), String> {
        self.allows(id, group, |r| &r.join, "join")
    }

    /// Whether `id` may publish to `group` here; the error says why not.
    pub fn may_publish(&self, id: BusId, group: &str) -> Result<(), String> {
        self.allows(id, group, |r| &r.publish, "publish to")
    }

    fn allows(
        &self,
        id: BusId,
        group: &str,
        list: impl Fn(&GroupRule) -> &Vec<String>,
        what: &str,
    ) -> Result<(), String> {
        let mut covered = false;
        for r in self.rules.iter().filter(|r| r.ids.0 <= id && id <= r.ids.1) {
            covered = true;
            if list(r).iter().any(|p| matches(p, group)) {
                return Ok(());
            }
        }
        let why = if covered {
            "the rules for its id allow it no such group"
        } else {
            "no rule names its id"
        };
        Err(format!(
            "bus id {id} may not {what} group {group:?} here (group_permissions: {why})"
        ))
    }

    /// Checks the rules: ranges in order, patterns that can match, within the bounds.
    pub fn validate(&self) -> Result<(), String> {
        if self.rules.len() > GROUP_RULES_MAX {
            return Err(format!(
                "group_permissions: {} rules (at most {GROUP_RULES_MAX})",
                self.rules.len()
            ));
        }
        for (i, r) in self.rules.iter().enumerate() {
            let at = format!("group_permissions rule {}", i + 1);
            if r.ids.0 > r.ids.1 {
                return Err(format!("{at}: ids {}..={} is empty", r.ids.0, r.ids.1));
            }
            for list in [&r.join, &r.publish] {
                if list.len() > GROUP_RULE_PATTERNS_MAX {
                    return Err(format!(
                        "{at}: {} patterns (at most {GROUP_RULE_PATTERNS_MAX})",
                        list.len()
                    ));
                }
                for p in list {
                    check_pattern(p).map_err(|e| format!("{at}: {e}"))?;
                }
            }
        }
        Ok(())
    }
}

/// When each publisher was last told that its publishes to a group are refused here.
#[derive(Default)]
pub struct RefusalReports {
    last: HashMap<(BusId, String), u64>,
}

impl RefusalReports {
    /// Whether to tell `publisher` now (`now_ms`) that its publishes to `group` are refused:
    /// at most once per `PUBLISH_REFUSAL_REPORT_INTERVAL_MS`.
    pub fn due(&mut self, publisher: BusId, group: &str, now_ms: u64) -> bool {
        let last = &mut self.last;
        let key = (publisher, group.to_owned());
        if last
            .get(&key)
            .is_some_and(|&at| now_ms.saturating_sub(at) < PUBLISH_REFUSAL_REPORT_INTERVAL_MS)
        {
            return false;
        }
        if last.len() >= REFUSAL_REPORTS_MAX {
            last.clear();
        }
        last.insert(key, now_ms);
        true
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A rule for ids `lo..=hi` that may join `join` and publish to `publish`.
    pub(crate) fn rule(lo: u64, hi: u64, join: &[&str], publish: &[&str]) -> GroupRule {
        GroupRule {
            ids: (BusId(lo), BusId(hi)),
            join: join.iter().map(|s| s.to_string()).collect(),
            publish: publish.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn rules_allow_by_id_range_name_and_prefix_and_say_why_not() {
        let p = GroupPermissions {
            rules: vec![
                rule(1, 9, &["scores", "chat.*"], &[]),
                rule(20, 20, &[], &["scores"]),
                rule(30, 39, &["*"], &["*"]),
            ],
        };
        p.validate().unwrap();
        assert!(p.may_join(BusId(5), "scores").is_ok());
        assert!(p.may_join(BusId(5), "chat.room1").is_ok());
        assert!(
            p.may_join(BusId(5), "chat").is_err(),
            "a prefix needs its dot"
        );
        let no = p.may_join(BusId(5), "news").unwrap_err();
        assert!(no.contains("allow it no such group"), "{no}");
        let none = p.may_join(BusId(10), "scores").unwrap_err();
        assert!(none.contains("no rule names its id"), "{none}");
        assert!(p.may_publish(BusId(20), "scores").is_ok());
        assert!(p.may_publish(BusId(5), "scores").is_err());
        assert!(p.may_publish(BusId(35), "anything").is_ok());
    }

    #[test]
    fn bad_rules_are_named() {
        let bad = |r: GroupRule| GroupPermissions { rules: vec![r] }.validate().unwrap_err();
        assert!(bad(rule(9, 1, &[], &[])).contains("is empty"));
        assert!(bad(rule(1, 9, &["a*"], &[])).contains("`*` stands alone"));
        assert!(bad(rule(1, 9, &[""], &[])).contains("pattern"));
    }

    #[test]
    fn a_refused_stream_is_reported_once_a_second() {
        let mut r = RefusalReports::default();
        assert!(r.due(BusId(1), "g", 0));
        assert!(!r.due(BusId(1), "g", 999));
        assert!(r.due(BusId(1), "h", 999), "per group");
        assert!(r.due(BusId(1), "g", 1_000));
    }
}
