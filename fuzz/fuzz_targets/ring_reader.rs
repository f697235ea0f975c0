//! A peer writes the shared-memory ring we read: any bytes, any published end.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    busway_shm::fuzzing::ring_reader(data);
});
