//! The order in which a node first saw each publisher's stream of a group, so that a full
//! table of streams forgets its oldest in O(1) (amortized): those of groups the node is not a
//! member of first (it only passes them on: forgotten, a copy by a second path may be passed
//! on twice), then its members' own. Keys whose stream was forgotten another way (a group
//! left) are dropped as they are met, and all at once when they are as many as the table
//! holds.

use std::collections::VecDeque;

/// Keys in the order first seen (see the module's documentation).
#[derive(Debug)]
pub struct SeenOrder<K> {
    /// Oldest first; some may be of groups joined since, or gone from the table.
    others: VecDeque<K>,
    /// Keys met in `others` whose group this node is a member of, oldest first.
    members: VecDeque<K>,
    /// A key was pushed since [`SeenOrder::tidy`] last looked.
    pushed: bool,
}

impl<K> Default for SeenOrder<K> {
    fn default() -> Self {
        Self {
            others: VecDeque::new(),
            members: VecDeque::new(),
            pushed: false,
        }
    }
}

impl<K: Clone> SeenOrder<K> {
    /// `key` is new in a table that holds `len` keys (`present` tells which): remembered.
    pub fn push(&mut self, key: K, len: usize, present: impl Fn(&K) -> bool) {
        self.tidy(len, present);
        self.push_new(key);
    }

    /// Drops the keys no longer `present` once they are as many as the table holds (`len`):
    /// call before [`SeenOrder::push_new`], which does not look. Looks only after a key was
    /// pushed since it last looked, so a caller may call it for every key it meets.
    pub fn tidy(&mut self, len: usize, present: impl Fn(&K) -> bool) {
        if self.pushed && self.others.len() + self.members.len() > 2 * len.max(1) {
            self.others.retain(&present);
            self.members.retain(&present);
        }
        self.pushed = false;
    }

    /// `key` is new in the table: remembered (see [`SeenOrder::tidy`]).
    pub fn push_new(&mut self, key: K) {
        self.others.push_back(key);
        self.pushed = true;
    }

    /// The oldest key still `present`, of a group this node is not a `member` of if any;
    /// taken out of the order.
    pub fn oldest(
        &mut self,
        present: impl Fn(&K) -> bool,
        member: impl Fn(&K) -> bool,
    ) -> Option<K> {
        while let Some(k) = self.others.pop_front() {
            if !present(&k) {
                continue;
            }
            if member(&k) {
                self.members.push_back(k);
                continue;
            }
            return Some(k);
        }
        while let Some(k) = self.members.pop_front() {
            if present(&k) {
                return Some(k);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn the_oldest_of_other_groups_goes_first_then_the_oldest_of_a_members() {
        let mut o = SeenOrder::default();
        let mut table: HashSet<u32> = HashSet::new();
        for k in 0..6 {
            o.push(k, table.len(), |k| table.contains(k));
            table.insert(k);
        }
        table.remove(&1);
        // Even keys: groups this node is a member of.
        let member = |k: &u32| k % 2 == 0;
        let mut gone = Vec::new();
        while let Some(k) = o.oldest(|k| table.contains(k), member) {
            table.remove(&k);
            gone.push(k);
        }
        assert_eq!(gone, vec![3, 5, 0, 2, 4], "1 was gone already");
    }

    #[test]
    fn keys_forgotten_another_way_do_not_pile_up() {
        let mut o = SeenOrder::default();
        let mut table: HashSet<u32> = HashSet::new();
        for k in 0..10_000 {
            o.push(k, table.len(), |k| table.contains(k));
            table.insert(k);
            // The table keeps at most 10: the rest is forgotten another way.
            if table.len() > 10 {
                table.remove(&(k - 10));
            }
        }
        assert!(o.others.len() + o.members.len() <= 2 * 10 + 2);
    }
}
