//! Entries `u16 LE length, payload` in a row, as a DATA_BATCH's body and a PUBLISH batch's
//! payload carry them (one reader for both, apart from `frame` and `group` so that neither
//! needs the other for it).

/// Bytes of the length before each entry (each message of a DATA_BATCH body).
pub const BATCH_ENTRY_HEADER_LEN: usize = 2;

/// Calls `f(start, len)` for each entry of `body` (`start` relative to it), in order: a
/// DATA_BATCH's body, or a PUBLISH batch's payload (`what` says which). If the entries do not
/// tile `body`, the error names `what`, the entry and its offset.
pub fn for_each_entry(
    body: &[u8],
    what: &str,
    mut f: impl FnMut(usize, usize),
) -> Result<(), String> {
    let mut i = 0;
    let mut n = 0;
    while i < body.len() {
        let Some(len) = body.get(i..i + BATCH_ENTRY_HEADER_LEN) else {
            return Err(format!(
                "{what} entry {n} at body offset {i}: truncated length"
            ));
        };
        let len = usize::from(u16::from_le_bytes([len[0], len[1]]));
        let start = i + BATCH_ENTRY_HEADER_LEN;
        if start + len > body.len() {
            return Err(format!(
                "{what} entry {n} at body offset {i}: {len} bytes declared, {} left",
                body.len() - start
            ));
        }
        f(start, len);
        i = start + len;
        n += 1;
    }
    Ok(())
}
