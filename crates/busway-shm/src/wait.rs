//! Sleeping on a 32-bit word in shared memory and waking its sleeper: the futex, shared between
//! processes (no `FUTEX_PRIVATE_FLAG`). Under loom, a Mutex/Condvar pair with the same contract,
//! so that the models find lost wake-ups as deadlocks.

use crate::sync::AtomicU32;
use std::time::Duration;

#[cfg(not(feature = "loom"))]
pub(crate) struct Waiter;

#[cfg(not(feature = "loom"))]
impl Waiter {
    pub(crate) fn new() -> Self {
        Waiter
    }

    /// Sleeps while `word` holds `expected`, at most `timeout`; may return early (spuriously).
    pub(crate) fn wait(&self, word: &AtomicU32, expected: u32, timeout: Duration) {
        use rustix::thread::futex;
        let ts = futex::Timespec {
            tv_sec: timeout.as_secs() as _,
            tv_nsec: timeout.subsec_nanos() as _,
        };
        // EAGAIN (the word changed), EINTR and ETIMEDOUT all mean: look again.
        let _ = futex::wait(word, futex::Flags::empty(), expected, Some(&ts));
    }

    /// Wakes the sleeper on `word`, if any.
    pub(crate) fn wake(&self, word: &AtomicU32) {
        let _ = rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), 1);
    }
}

#[cfg(feature = "loom")]
#[derive(Default)]
pub(crate) struct Waiter {
    lock: loom::sync::Mutex<()>,
    cond: loom::sync::Condvar,
}

#[cfg(feature = "loom")]
impl Waiter {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn wait(&self, word: &AtomicU32, expected: u32, _timeout: Duration) {
        use std::sync::atomic::Ordering::SeqCst;
        let guard = self.lock.lock().unwrap();
        // Checked under the lock that `wake` takes: a wake after this check finds the waiter
        // already waiting, as with the futex's atomic compare-and-sleep.
        if word.load(SeqCst) == expected {
            drop(self.cond.wait(guard).unwrap());
        }
    }

    pub(crate) fn wake(&self, _word: &AtomicU32) {
        let _guard = self.lock.lock().unwrap();
        self.cond.notify_all();
    }
}
