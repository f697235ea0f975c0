//! What an established peer can send besides DATA: ROUTED bodies (relayed data, FAIL, HINT)
//! and CHANNEL bodies (shared-memory offers).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| busway_core::fuzzing::peer_bodies(data));
