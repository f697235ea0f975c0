//! How every ratio of `busway bench` reads: higher is better for busway, in every table and
//! JSON row. A rate (messages, calls, MiB or deliveries per second) is busway's over its
//! baseline's, `busway/raw`; a time (a round trip's p50) is the baseline's over busway's,
//! `raw/busway`. Either way 2.00 says busway did twice as well as the baseline of the same
//! run, 0.50 half as well. (Before, the latency table's ratio was busway's p50 over the raw
//! one, so there a lower figure was the better one.)

/// The scheme: under `busway bench --help`; each table's header line says its own column's.
pub(crate) const SCHEME: &str = "\
Ratios: higher is better for busway, in every table. For rates (msg/s, calls/s, MiB/s) the \
column is busway/raw; for times (--latency p50) it is raw/busway; --broadcast's \
publish/unicast is the group's deliveries/s over those of one unicast send per member. \
2.00: busway did twice as well as the baseline of the same run; 0.50: half as well.
JSON keys: busway_over_raw, p50_raw_over_busway, publish_over_unicast (ratio_to_raw and \
ratio_to_unicast: the same figures under their first names; p50_ratio_to_raw: busway's p50 \
over raw's, lower is better, kept as it was).";

/// Smallest divisor of a ratio: a side that measured nothing (0) makes a large figure, not
/// `inf`, which JSON cannot carry.
const DIVISOR_MIN: f64 = 1e-9;

/// busway's rate over its baseline's: above 1 when busway moves more per second.
pub(super) fn of_rates(busway: f64, baseline: f64) -> f64 {
    busway / baseline.max(DIVISOR_MIN)
}

/// The baseline's time over busway's: above 1 when busway takes less time.
pub(super) fn of_times(busway: f64, baseline: f64) -> f64 {
    baseline / busway.max(DIVISOR_MIN)
}

/// The figures of the column headed `header` in a printed table, one per row below the header
/// line: each column is right-aligned, so a row's figure ends where its header does.
#[cfg(test)]
pub(super) fn column(table: &str, header: &str) -> Vec<f64> {
    let mut lines = table.lines().skip_while(|l| !l.starts_with("link"));
    let head = lines
        .next()
        .unwrap_or_else(|| panic!("no header in\n{table}"));
    let end = head
        .find(header)
        .unwrap_or_else(|| panic!("no {header:?} in {head:?}"))
        + header.len();
    lines
        .map(|l| {
            let cell = l.get(..end).unwrap_or(l).split_whitespace().last();
            cell.and_then(|c| c.parse().ok())
                .unwrap_or_else(|| panic!("no {header:?} figure in {l:?}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_better_busway_gives_a_ratio_above_one_for_rates_and_for_times() {
        assert_eq!(of_rates(2e6, 1e6), 2.0);
        assert_eq!(of_times(5.0, 10.0), 2.0);
        assert!(of_rates(1.0, 0.0).is_finite());
        assert!(of_times(0.0, 1.0).is_finite());
    }

    #[test]
    fn a_column_is_read_by_where_its_header_ends() {
        let table =
            "title\nlink   a b  busway/raw\ntcp4   1 2        1.50\nshm    3 4       12.25\n";
        assert_eq!(column(table, "busway/raw"), [1.5, 12.25]);
    }
}
