//! An up link's state machine fed any frames, with valid checks so that they reach the rules
//! behind them (see `busway_core::fuzzing::link`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| busway_core::fuzzing::link(data));
