//! A group's publisher writes the shared-memory log we read: any bytes, any published end and
//! oldest record, any header words.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    busway_shm::fuzzing::log_reader(data);
});
