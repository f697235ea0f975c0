//! The atomics the ring uses: std's, or loom's when the loom models are built.

#[cfg(feature = "loom")]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64};
#[cfg(not(feature = "loom"))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64};
