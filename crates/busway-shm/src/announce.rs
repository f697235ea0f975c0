//! Segments announced to a peer by descriptor (`/proc/PID/fd/FD` and the segment's inode),
//! and found again without a second mapping when the peer runs in the same process: an
//! offered ring or a group's log is registered here as it is announced, weakly, so that one
//! nobody took goes with its owner.

use crate::Segment;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// Where a peer finds a segment: the announcing process, its descriptor there, the inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announced {
    /// The announcing process.
    pub pid: u32,
    /// The segment's descriptor in that process.
    pub fd: u32,
    /// The segment's inode (a descriptor reused for another file does not match).
    pub inode: u64,
}

/// What this process announced, by (descriptor, inode), for readers in this process.
pub struct InProcess<T> {
    announced: Mutex<Vec<(u32, u64, Weak<T>)>>,
}

impl<T> Default for InProcess<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> InProcess<T> {
    /// Nothing announced yet (a `static` may hold it).
    pub const fn new() -> Self {
        Self {
            announced: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<(u32, u64, Weak<T>)>> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.announced.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Announces `item`, held in `segment`: where a peer finds it, registered for a peer in
    /// this process (entries whose item is gone are dropped meanwhile).
    pub fn announce(&self, segment: &Segment, item: &Arc<T>) -> io::Result<Announced> {
        let announced = Announced {
            pid: std::process::id(),
            fd: segment.fd().as_raw_fd() as u32,
            inode: segment.inode()?,
        };
        let mut all = self.lock();
        all.retain(|(_, _, i)| i.strong_count() > 0);
        all.push((announced.fd, announced.inode, Arc::downgrade(item)));
        Ok(announced)
    }

    /// The item this process announced at `at` that `fits` says is the one (none if `at`
    /// names another process); `take`: it is found once (a ring has one reader).
    pub fn find(&self, at: &Announced, fits: impl Fn(&T) -> bool, take: bool) -> Option<Arc<T>> {
        if at.pid != std::process::id() {
            return None;
        }
        let mut all = self.lock();
        let i = all.iter().position(|(f, n, i)| {
            (*f, *n) == (at.fd, at.inode) && i.upgrade().is_some_and(|i| fits(&i))
        })?;
        if take {
            all.swap_remove(i).2.upgrade()
        } else {
            all[i].2.upgrade()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announced_item_is_found_while_it_lives_and_taken_once() {
        let reg = InProcess::new();
        let seg = Segment::create("announce-test", 4096).unwrap();
        let item = Arc::new(7u32);
        let at = reg.announce(&seg, &item).unwrap();
        assert_eq!(reg.find(&at, |&i| i == 8, false), None, "not the one");
        assert_eq!(reg.find(&at, |&i| i == 7, false), Some(item.clone()));
        let elsewhere = Announced {
            pid: at.pid + 1,
            ..at
        };
        assert_eq!(reg.find(&elsewhere, |_| true, false), None);
        assert_eq!(reg.find(&at, |_| true, true), Some(item.clone()));
        assert_eq!(reg.find(&at, |_| true, true), None, "taken");
        let again = reg.announce(&seg, &item).unwrap();
        drop(item);
        assert_eq!(
            reg.find(&again, |_| true, false),
            None,
            "gone with its owner"
        );
    }
}
