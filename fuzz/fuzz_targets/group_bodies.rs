//! What an established peer can send of groups: INTEREST, REPAIR and PUBLISH bodies (single
//! publishes, batches and marks), down to a member's and a relay's group state.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| busway_core::fuzzing::group_bodies(data));
