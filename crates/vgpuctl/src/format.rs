//! Human-readable sizes, durations and tables.

/// Bytes in binary units: exact ("512MiB") when a unit divides it, one
/// decimal ("1.5GiB") otherwise.
pub fn bytes(n: u64) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    for (shift, unit) in UNITS {
        let one = 1u64 << shift;
        if n >= one {
            return if n.is_multiple_of(one) {
                format!("{}{unit}", n >> shift)
            } else {
                format!("{:.1}{unit}", n as f64 / one as f64)
            };
        }
    }
    format!("{n}B")
}

/// Seconds as "850ns", "12µs", "3.4ms", "1.25s".
pub fn secs(s: f64) -> String {
    if !s.is_finite() || s <= 0.0 {
        "0".into()
    } else if s < 1e-6 {
        format!("{:.0}ns", s * 1e9)
    } else if s < 1e-3 {
        format!("{:.0}µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.1}ms", s * 1e3)
    } else {
        format!("{s:.2}s")
    }
}

/// A ratio as a percentage, "12.5%".
pub fn percent(r: f64) -> String {
    if r.is_finite() {
        format!("{:.1}%", r * 100.0)
    } else {
        "-".into()
    }
}

/// A rate per second, "1234/s" or "1.2k/s".
pub fn rate(r: f64) -> String {
    if !r.is_finite() {
        "-".into()
    } else if r >= 10_000.0 {
        format!("{:.1}k/s", r / 1000.0)
    } else {
        format!("{r:.0}/s")
    }
}

/// A table printed with aligned columns.
pub struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new(header: &[&'static str]) -> Table {
        Table {
            header: header.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (as many cells as columns).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, each line ending with a newline.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        let mut line = |cells: Vec<&str>| {
            let mut l = String::new();
            for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
                if i + 1 == cells.len() {
                    l.push_str(c);
                } else {
                    let pad = w - c.chars().count();
                    l.push_str(c);
                    l.push_str(&" ".repeat(pad + 2));
                }
            }
            out.push_str(l.trim_end());
            out.push('\n');
        };
        line(self.header.clone());
        for r in &self.rows {
            line(r.iter().map(String::as_str).collect());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_units() {
        assert_eq!(bytes(512 << 20), "512MiB");
        assert_eq!(bytes(3 << 29), "1.5GiB");
        assert_eq!(bytes(100), "100B");
        assert_eq!(secs(0.000021), "21µs");
        assert_eq!(secs(0.0034), "3.4ms");
        assert_eq!(secs(2.0), "2.00s");
        assert_eq!(percent(0.125), "12.5%");
        assert_eq!(rate(12345.0), "12.3k/s");
    }

    #[test]
    fn test_table() {
        let mut t = Table::new(&["NAME", "X"]);
        t.row(vec!["long-name".into(), "1".into()]);
        assert_eq!(t.render(), "NAME       X\nlong-name  1\n");
    }
}
