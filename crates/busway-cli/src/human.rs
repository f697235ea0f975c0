//! Numbers written for people: counts with thousands separators, rates with a unit prefix
//! (the status page and `busway status`).

/// A count with thousands separators: `1,409,778`.
pub(crate) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A rate with three significant digits and a unit prefix: `950`, `12.3 k`, `1.41 M`.
pub(crate) fn rate(x: f64) -> String {
    let (v, unit) = match x.abs() {
        a if a >= 1e9 => (x / 1e9, " G"),
        a if a >= 1e6 => (x / 1e6, " M"),
        a if a >= 1e3 => (x / 1e3, " k"),
        _ => return format!("{}", x.round()),
    };
    let decimals = if v.abs() >= 100.0 {
        0
    } else if v.abs() >= 10.0 {
        1
    } else {
        2
    };
    format!("{v:.decimals$}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_for_people() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(1_409_778), "1,409,778");
        assert_eq!(rate(0.0), "0");
        assert_eq!(rate(950.4), "950");
        assert_eq!(rate(12_345.0), "12.3 k");
        assert_eq!(rate(1_409_778.0), "1.41 M");
        assert_eq!(rate(250_000_000.0), "250 M");
        assert_eq!(rate(2.5e9), "2.50 G");
    }
}
