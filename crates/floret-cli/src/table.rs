//! Plain-text tables for the CLI's reports: each column as wide as its
//! widest cell, so a long producer id widens its column instead of pushing
//! the others out of line; figures right-aligned, names left-aligned; and
//! figures in human units (thousands separated, bytes in KiB/MiB/GiB,
//! durations in ms, s, min or h).
//!
//! IMPLEMENTATION CAVEATS
//! - Widths count characters, not terminal cells: wide characters in a
//!   producer id shift its row.

/// How a column's cells line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Names.
    Left,
    /// Figures.
    Right,
}

/// A table being filled, row by row.
#[derive(Debug, Clone)]
pub struct Table {
    columns: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers and alignments.
    pub fn new(columns: &[(&'static str, Align)]) -> Self {
        Self {
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are blank, extra ones dropped.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as lines, each starting with `indent`, without trailing spaces.
    pub fn render(&self, indent: &str) -> String {
        let cell = |row: &[String], column: usize| row.get(column).cloned().unwrap_or_default();
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|column| {
                self.rows
                    .iter()
                    .map(|row| cell(row, column).chars().count())
                    .chain([self.columns[column].0.chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let headers: Vec<String> = self
            .columns
            .iter()
            .map(|(name, _)| name.to_string())
            .collect();
        std::iter::once(&headers)
            .chain(&self.rows)
            .map(|row| {
                let cells: Vec<String> = self
                    .columns
                    .iter()
                    .enumerate()
                    .map(|(column, (_, align))| {
                        let text = cell(row, column);
                        let width = widths[column];
                        match align {
                            Align::Left => format!("{text:<width$}"),
                            Align::Right => format!("{text:>width$}"),
                        }
                    })
                    .collect();
                format!("{indent}{}", cells.join("  "))
                    .trim_end()
                    .to_owned()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `1234567` as `1,234,567`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

/// Bytes in the largest binary unit that keeps a figure of at least 1.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Milliseconds as ms under a second, then s, min or h.
pub fn millis(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1_000.0),
        60_000..3_600_000 => format!("{:.1} min", ms as f64 / 60_000.0),
        _ => format!("{:.1} h", ms as f64 / 3_600_000.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_producer_id_broke_the_columns() {
        let mut table = Table::new(&[("producer", Align::Left), ("backlog", Align::Right)]);
        table.row(vec!["p1".into(), count(5)]);
        table.row(vec![
            "acme/a-producer-id-much-longer-than-32-characters".into(),
            count(1_234_567),
        ]);
        let rendered = table.render("  ");
        let lines: Vec<&str> = rendered.lines().collect();
        assert_eq!(
            lines,
            [
                "  producer                                             backlog",
                "  p1                                                         5",
                "  acme/a-producer-id-much-longer-than-32-characters  1,234,567",
            ]
        );
    }

    #[test]
    fn figures_come_in_human_units() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_000), "1,000");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1_536), "1.5 KiB");
        assert_eq!(bytes(128 * 1024 * 1024), "128.0 MiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
        assert_eq!(millis(850), "850 ms");
        assert_eq!(millis(1_500), "1.5 s");
        assert_eq!(millis(90_000), "1.5 min");
        assert_eq!(millis(5_400_000), "1.5 h");
    }
}
