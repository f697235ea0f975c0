//! What an established peer can send besides DATA: ROUTED bodies (relayed data, FAIL, HINT)
//! CHANNEL bodies (shared-memory offers) and REGISTER bodies (a relay's registrations).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| busway_core::fuzzing::peer_bodies(data));
