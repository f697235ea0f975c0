//! Everything an unauthenticated peer can send goes through the handshake.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| busway_core::fuzzing::handshake(data));
