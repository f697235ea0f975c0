//! Everything a peer can send after the handshake goes through the frame decoder first.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| busway_core::fuzzing::frame_decoder(data));
