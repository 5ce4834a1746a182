//! How the report writes its numbers, for every format and every family's analysis: counts
//! grouped by thousands and with their noun in the right number, bytes in binary units,
//! shares as percentages.

/// 0.771 -> "77.1%".
pub fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// 1234567 -> "1,234,567".
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A count and its noun, singular for 1: `count(1, "sample", "samples")` -> "1 sample",
/// `count(12345, ...)` -> "12,345 samples". Both forms are given, as English plurals are not
/// all an "s" away ("process", "library").
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", thousands(n), if n == 1 { one } else { many })
}

/// A time a recommendation could win back: "1.23 s", "0.45 s", "3.2 ms", "80 µs".
pub fn seconds(s: f64) -> String {
    match s {
        s if s >= 0.1 => format!("{s:.2} s"),
        s if s >= 0.001 => format!("{:.1} ms", s * 1e3),
        s => format!("{:.0} µs", s * 1e6),
    }
}

/// An estimate to the two significant digits it can claim: 1.2538 -> "1.3", 0.051234 ->
/// "0.051", 40.561 -> "41" (larger numbers keep their integer digits).
pub fn two_digits(x: f64) -> String {
    if x <= 0.0 || !x.is_finite() {
        return "0".into();
    }
    let decimals = (1 - x.log10().floor() as i32).max(0) as usize;
    format!("{x:.decimals$}")
}

/// "1.5 MiB".
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_take_the_singular_for_one() {
        assert_eq!(count(1, "sample", "samples"), "1 sample");
        assert_eq!(count(0, "sample", "samples"), "0 samples");
        assert_eq!(count(2, "process", "processes"), "2 processes");
        assert_eq!(count(12_345, "call", "calls"), "12,345 calls");
    }

    #[test]
    fn byte_counts_read_naturally() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(4096), "4.0 KiB");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
    }

    #[test]
    fn estimates_keep_two_significant_digits() {
        assert_eq!(two_digits(1.2538), "1.3");
        assert_eq!(two_digits(0.051234), "0.051");
        assert_eq!(two_digits(40.561), "41");
        assert_eq!(two_digits(1528.0), "1528");
        assert_eq!(two_digits(0.0), "0");
    }

    #[test]
    fn seconds_read_naturally() {
        assert_eq!(seconds(1.234), "1.23 s");
        assert_eq!(seconds(0.746), "0.75 s");
        assert_eq!(seconds(0.0032), "3.2 ms");
        assert_eq!(seconds(0.00008), "80 µs");
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }
}
